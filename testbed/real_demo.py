"""`specwatch demo --real`: the demo's drafter-bump story on a REAL vLLM (the CPU build), not a simulator.

1. Install the engine venv on first use (pip's progress shown), build the tiny models, start vLLM with a good
   drafter and per-request spec-decode metrics.
2. Measure the route's baseline from the engine's own per-request metrics and pin it in the daemon's config.
3. Run the daemon in-process with a few greedy requests a second flowing, and show the live status table.
4. After `--bump-after` seconds, redeploy the engine with a noisier drafter under the same model name: within
   about a minute of the engine answering again the route turns DEGRADED.

The detector's guards are shortened as in the end-to-end tests (the story takes minutes, not hours).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console, Group
from rich.text import Text

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.export.http import routes_document, serve
from specwatch.scheduler import start_scheduler
from testbed.baseline import measure as measure_baseline
from testbed.engine_env import VLLM_VERSION, cpu_support, ensure_engine_env
from testbed.load import BackgroundLoad
from testbed.models import GOOD_DRAFTER_NOISE, WORSE_DRAFTER_NOISE, TinyModels, build_tiny_models
from testbed.vllm_server import VllmServer, VllmServerSpec

K = 3
DETECTION = {"min_drafted_tokens": 300, "min_duration": "5s", "confirm_window": "10s", "block": "15s"}

log = logging.getLogger(__name__)


def run_real_demo(
    console: Console,
    listen_address: str,
    duration: float,
    bump_after: float,
    stop: threading.Event,
    watch: Callable[[Daemon, Callable[[dict], Group]], None],
    state_dir: str | None = None,
) -> int:
    supported, reason = cpu_support()
    if not supported:
        console.print(f"specwatch demo --real: the real vLLM engine cannot run here: {reason}")
        return 1
    console.print(Text(f"specwatch demo --real: a REAL vLLM {VLLM_VERSION} (CPU build) on this machine", style="bold"))
    env = ensure_engine_env(show_progress=True, announce=console.print)
    console.print("building the tiny models (a seeded 2-layer Llama and its drafters)...")
    models = build_tiny_models(env)
    workdir = Path(tempfile.mkdtemp(prefix="specwatch-demo-real-"))
    spec = VllmServerSpec(
        model=models.target,
        max_num_seqs=8,
        per_request_spec_metrics="summary",
        speculative={
            "method": "draft_model",
            "num_speculative_tokens": K,
            "model": str(models.drafter(GOOD_DRAFTER_NOISE)),
        },
    )
    server = VllmServer(env, spec, workdir)
    console.print(f"starting vLLM on {server.base_url} (about a minute; log: {server.log_path})...")
    server.start()
    daemon = http = scheduler = load = None
    story = _Story()
    try:
        baseline = measure_baseline(server.base_url, "tiny")
        console.print(
            f"baseline measured from the engine's per-request metrics: acceptance "
            f"{baseline.acceptance_ratio:.3f}, design effect {baseline.overdispersion:.2f} "
            f"({baseline.requests} requests)"
        )
        config = parse_config(
            {
                "interval": "1s",
                "state_dir": state_dir or str(workdir / "state"),
                "gpu": {"enabled": "false"},
                "scrape": {"timeout": "0.9s"},
                "detection": DETECTION,
                "routes": [
                    {"name": "chat", "url": server.metrics_url, "engine": "vllm", "baseline": baseline.config()}
                ],
            },
            "demo config",
        )
        daemon = Daemon(config)
        http = serve(listen_address, lambda: daemon.snapshot)
        daemon.tick()
        scheduler = start_scheduler(daemon, config.interval_seconds)
        load = BackgroundLoad(
            server.base_url, "tiny", concurrency=2, max_tokens=32, max_seconds=duration if duration > 0 else 3600.0
        )
        load.start()
        console.print(f"  daemon: {http.url}/metrics  {http.url}/api/v1/routes  (Ctrl-C to stop)")
        console.print(f"  the drafter is swapped for a worse one in {bump_after:.0f}s")
        threading.Thread(
            target=_bump_later, args=(server, spec, models, bump_after, story, stop), daemon=True, name="demo-bump"
        ).start()

        def frame(doc: dict) -> Group:
            from specwatch.commands.status import render_status_table

            since = "" if story.bumped_at is None else f", {time.monotonic() - story.bumped_at:.0f}s since"
            head = Text(
                f"REAL vLLM {VLLM_VERSION} (CPU): {story.phase}{since}; {load.stats.ok} requests served", style="dim"
            )
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


@dataclass
class _Story:
    phase: str = "good drafter"
    bumped_at: float | None = None


def _bump_later(
    server: VllmServer, spec: VllmServerSpec, models: TinyModels, delay: float, story: _Story, stop: threading.Event
) -> None:
    if stop.wait(delay):
        return
    story.phase = "redeploying with a worse drafter (same model name)"
    log.warning("demo: redeploying vLLM with a noisier drafter under the same model name")
    try:
        server.restart(spec.with_speculative(model=str(models.drafter(WORSE_DRAFTER_NOISE))))
    except Exception as exc:  # noqa: BLE001 - the demo is stopping (the server was stopped under us) or broke
        if not stop.is_set():
            log.error("demo: the redeploy failed: %s", exc)
        return
    story.bumped_at = time.monotonic()
    story.phase = "worse drafter since the redeploy"
