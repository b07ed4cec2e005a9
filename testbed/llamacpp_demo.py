"""`specwatch demo --real llamacpp`: the demo's drafter-bump story on a REAL llama.cpp `llama-server`.

1. Build llama-server on first use (testbed/llamacpp_build.py, progress shown; cached afterwards), write the tiny
   GGUF models, start llama-server with a good drafter.
2. Measure the route's baseline from the answers' own `timings` (draft_n, draft_n_accepted) and pin it.
3. Run the daemon in-process with greedy requests flowing, and show the live status table.
4. After `--bump-after` seconds, restart llama-server with a noisier drafter under the same alias: the route
   turns DEGRADED within about a minute of the engine answering again.

The detector's guards are shortened as in the end-to-end tests (the story takes minutes, not hours).
"""

from __future__ import annotations

import logging
import tempfile
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
from testbed import llamacpp_build, llamacpp_models
from testbed.llamacpp_server import LlamaServer, LlamaServerSpec, Load, measure_baseline

K = 4
GOOD, WORSE = "small", "large"  # llamacpp_models.DRAFTERS: acceptance about 0.70 and 0.39
DETECTION = {"min_drafted_tokens": 300, "min_duration": "5s", "confirm_window": "10s", "block": "15s"}

log = logging.getLogger(__name__)


@dataclass
class _Story:
    phase: str = "good drafter"
    bumped_at: float | None = None


def run_real_demo(
    console: Console,
    listen_address: str,
    duration: float,
    bump_after: float,
    stop: threading.Event,
    watch: Callable[[Daemon, Callable[[dict], Group]], None],
    state_dir: str | None = None,
) -> int:
    console.print(
        Text(f"specwatch demo --real llamacpp: a REAL llama-server b{llamacpp_build.BUILD_NUMBER}", style="bold")
    )
    if not llamacpp_build.is_current():
        console.print("building llama-server once (15-30 minutes on 2 cores; cached in ~/.cache/specwatch)...")
    binary = llamacpp_build.build()
    workdir = Path(tempfile.mkdtemp(prefix="specwatch-demo-llamacpp-"))
    console.print("writing the tiny GGUF models (a seeded 2-layer Llama and its drafters)...")
    models = llamacpp_models.write_all(workdir / "models")
    spec = LlamaServerSpec(model=models["target"], drafter=models[GOOD], draft_max=K)
    server = LlamaServer(binary, spec, workdir)
    console.print(f"starting llama-server on {server.base_url} (log: {server.log_path})...")
    server.start()
    daemon = http = scheduler = load = None
    story = _Story()
    try:
        rate, phi = measure_baseline(server, 16)
        console.print(f"baseline measured from the answers' timings: acceptance {rate:.3f}, design effect {phi:.2f}")
        raw: dict[str, Any] = {
            "interval": "1s",
            "state_dir": state_dir or str(workdir / "state"),
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": "0.9s"},
            "detection": DETECTION,
            "routes": [
                {
                    "name": "chat",
                    "url": server.metrics_url,
                    "engine": "llamacpp",
                    "baseline": {"acceptance_ratio": round(rate, 6), "overdispersion": round(phi, 4)},
                }
            ],
        }
        config = parse_config(raw, "demo config")
        daemon = Daemon(config)
        http = serve(listen_address, lambda: daemon.snapshot)
        daemon.tick()
        scheduler = start_scheduler(daemon, config.interval_seconds)
        load = Load(server).start()
        console.print(f"  daemon: {http.url}/metrics  {http.url}/api/v1/routes  (Ctrl-C to stop)")
        console.print(f"  the drafter is swapped for a worse one in {bump_after:.0f}s")
        threading.Thread(
            target=_bump_later, args=(server, models[WORSE], bump_after, story, stop), daemon=True, name="demo-bump"
        ).start()

        def frame(doc: dict) -> Group:
            from specwatch.commands.status import render_status_table

            since = "" if story.bumped_at is None else f", {time.monotonic() - story.bumped_at:.0f}s since"
            served = load.ok if load is not None else 0
            head = Text(f"REAL llama-server (CPU): {story.phase}{since}; {served} requests served", style="dim")
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


def _bump_later(server: LlamaServer, drafter: Path, delay: float, story: _Story, stop: threading.Event) -> None:
    if stop.wait(delay):
        return
    story.phase = "restarting with a worse drafter (same alias)"
    log.warning("demo: restarting llama-server with a noisier drafter under the same alias")
    try:
        server.restart(server.spec.with_drafter(drafter))
    except Exception as exc:  # noqa: BLE001 - the demo is stopping (the server was stopped under us) or broke
        if not stop.is_set():
            log.error("demo: the restart failed: %s", exc)
        return
    story.bumped_at = time.monotonic()
    story.phase = "worse drafter since the restart"
