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

import tempfile
from pathlib import Path

from rich.console import Console
from rich.text import Text

from testbed import llamacpp_build, llamacpp_models
from testbed.demo_story import Bump, Staged, real_demo
from testbed.llamacpp_server import LlamaServer, LlamaServerSpec, Load, measure_baseline

K = 4
GOOD, WORSE = "small", "large"  # llamacpp_models.DRAFTERS: acceptance about 0.70 and 0.39


def _stage(console: Console, duration: float) -> Staged | int:
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

    def measure() -> dict[str, float]:
        rate, phi = measure_baseline(server, 16)
        console.print(f"baseline measured from the answers' timings: acceptance {rate:.3f}, design effect {phi:.2f}")
        return {"acceptance_ratio": round(rate, 6), "overdispersion": round(phi, 4)}

    return Staged(
        server=server,
        workdir=workdir,
        engine="llamacpp",
        measure=measure,
        start_load=lambda: Load(server).start(),
        served=lambda load: load.ok,
        headline="REAL llama-server (CPU)",
        bump=Bump(
            worse_spec=lambda: server.spec.with_drafter(models[WORSE]),
            acting="restarting",
            act="restart",
            engine="llama-server",
            same="alias",
        ),
    )


run_real_demo = real_demo(_stage)
