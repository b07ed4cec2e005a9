"""The drafter-bump story both real demos tell (`specwatch demo --real`, `specwatch demo --real llamacpp`), once
their engine server is up: pin the measured baseline, run the daemon in-process under load, show the live status
table, and after `bump_after` seconds restart the engine with a worse drafter on the same port and name.

The detector's guards are shortened as in the end-to-end tests (the story takes minutes, not hours).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console, Group
from rich.text import Text

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.export.http import routes_document, serve
from specwatch.scheduler import start_scheduler
from testbed.server_process import ServerProcess

DETECTION = {"min_drafted_tokens": 300, "min_duration": "5s", "confirm_window": "10s", "block": "15s"}

log = logging.getLogger(__name__)


@dataclass
class Story:
    phase: str = "good drafter"
    bumped_at: float | None = None


@dataclass(frozen=True)
class Bump:
    """How the engine is restarted with the worse drafter, and how the story words it."""

    worse_spec: Callable[[], Any]  # the spec to restart with, made when the bump comes
    acting: str  # "restarting"
    act: str  # "restart"
    engine: str  # "llama-server"
    same: str  # what stays the same: "alias"


@dataclass(frozen=True)
class Staged:
    """A demo's started engine server and what the story needs to know about it."""

    server: ServerProcess[Any]
    workdir: Path
    engine: str  # the route's `engine:`
    measure: Callable[[], dict[str, Any]]  # prints and returns the route's baseline config
    start_load: Callable[[], Any]  # starts the requests and returns what stop() stops them
    served: Callable[[Any], int]  # requests that load has had answered
    headline: str  # names the engine above the table
    bump: Bump


Watch = Callable[[Daemon, Callable[[dict], Group]], None]


def real_demo(stage: Callable[[Console, float], Staged | int]) -> Callable[..., int]:
    """`specwatch demo --real`'s entry point from `stage(console, duration)`, which starts the engine server (or
    returns an exit code where it cannot)."""

    def run_real_demo(
        console: Console,
        listen_address: str,
        duration: float,
        bump_after: float,
        stop: threading.Event,
        watch: Watch,
        state_dir: str | None = None,
    ) -> int:
        staged = stage(console, duration)
        if isinstance(staged, int):
            return staged
        return tell(console, listen_address, stop, watch, staged, state_dir, bump_after)

    return run_real_demo


def tell(
    console: Console,
    listen_address: str,
    stop: threading.Event,
    watch: Watch,
    staged: Staged,
    state_dir: str | None,
    bump_after: float,
) -> int:
    """The story on a started server, stopped at the end."""
    server = staged.server
    daemon = http = scheduler = load = None
    story = Story()
    try:
        baseline = staged.measure()
        config = parse_config(
            {
                "interval": "1s",
                "state_dir": state_dir or str(staged.workdir / "state"),
                "gpu": {"enabled": "false"},
                "scrape": {"timeout": "0.9s"},
                "detection": DETECTION,
                "routes": [{"name": "chat", "url": server.metrics_url, "engine": staged.engine, "baseline": baseline}],
            },
            "demo config",
        )
        daemon = Daemon(config)
        http = serve(listen_address, lambda: daemon.snapshot)
        daemon.tick()
        scheduler = start_scheduler(daemon, config.interval_seconds)
        load = staged.start_load()
        console.print(f"  daemon: {http.url}/metrics  {http.url}/api/v1/routes  (Ctrl-C to stop)")
        console.print(f"  the drafter is swapped for a worse one in {bump_after:.0f}s")
        threading.Thread(
            target=_bump_later, args=(server, staged.bump, bump_after, story, stop), daemon=True, name="demo-bump"
        ).start()

        def frame(doc: dict) -> Group:
            from specwatch.commands.status import render_status_table

            since = "" if story.bumped_at is None else f", {time.monotonic() - story.bumped_at:.0f}s since"
            count = staged.served(load) if load is not None else 0
            head = Text(f"{staged.headline}: {story.phase}{since}; {count} requests served", style="dim")
            return Group(render_status_table(doc), head)

        watch(daemon, frame)
        console.print(frame(routes_document(daemon.snapshot)))
        return 0
    finally:
        stop.set()
        if load is not None:
            load.stop()
        if scheduler is not None:
            scheduler.shutdown(wait=True)
        if http is not None:
            http.shutdown()
        if daemon is not None:
            daemon.close()
        server.stop()


def _bump_later(server: ServerProcess[Any], bump: Bump, delay: float, story: Story, stop: threading.Event) -> None:
    if stop.wait(delay):
        return
    story.phase = f"{bump.acting} with a worse drafter (same {bump.same})"
    log.warning("demo: %s %s with a noisier drafter under the same %s", bump.acting, bump.engine, bump.same)
    try:
        server.restart(bump.worse_spec())
    except Exception as exc:  # noqa: BLE001 - the demo is stopping (the server was stopped under us) or broke
        if not stop.is_set():
            log.error("demo: the %s failed: %s", bump.act, exc)
        return
    story.bumped_at = time.monotonic()
    story.phase = f"worse drafter since the {bump.act}"
