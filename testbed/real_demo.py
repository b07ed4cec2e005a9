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

import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from testbed.baseline import measure as measure_baseline
from testbed.demo_story import Bump, Staged, real_demo
from testbed.engine_env import VLLM_VERSION, cpu_support, ensure_engine_env
from testbed.load import BackgroundLoad
from testbed.models import GOOD_DRAFTER_NOISE, WORSE_DRAFTER_NOISE, build_tiny_models
from testbed.vllm_server import VllmServer, VllmServerSpec

K = 3


def _stage(console: Console, duration: float) -> Staged | int:
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

    def measure() -> dict[str, Any]:
        baseline = measure_baseline(server.base_url, "tiny")
        console.print(
            f"baseline measured from the engine's per-request metrics: acceptance "
            f"{baseline.acceptance_ratio:.3f}, design effect {baseline.overdispersion:.2f} "
            f"({baseline.requests} requests)"
        )
        return baseline.config()

    def start_load() -> BackgroundLoad:
        load = BackgroundLoad(
            server.base_url, "tiny", concurrency=2, max_tokens=32, max_seconds=duration if duration > 0 else 3600.0
        )
        load.start()
        return load

    return Staged(
        server=server,
        workdir=workdir,
        engine="vllm",
        measure=measure,
        start_load=start_load,
        served=lambda load: load.stats.ok,
        headline=f"REAL vLLM {VLLM_VERSION} (CPU)",
        bump=Bump(
            worse_spec=lambda: spec.with_speculative(model=str(models.drafter(WORSE_DRAFTER_NOISE))),
            acting="redeploying",
            act="redeploy",
            engine="vLLM",
            same="model name",
        ),
    )


run_real_demo = real_demo(_stage)
