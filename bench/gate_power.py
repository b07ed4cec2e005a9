"""The acceptance gate's power on a real engine: the smallest drop `specwatch gate` fails at 95% confidence with
the built-in probe set, measured on llama-server (testbed/: the tiny GGUF target and drafters of rising noise,
each accepted less often than the last).

A reference is recorded from the drafter at the first noise level; then the server is restarted with each
drafter in turn and the gate run against it, `--runs` times each. Greedy decoding makes a run repeat exactly, so
one run per drafter says it all; more check that. Prints one row per drafter: the measured drop, its interval,
the verdict. Needs llama-server built (python -m testbed.llamacpp_build) and the gguf writer (numpy).

    .venv/bin/python bench/gate_power.py [--noise 0.02 0.025 0.03 0.035 0.04 0.05] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch.cli import main as cli_main
from testbed import llamacpp_build, llamacpp_models
from testbed.llamacpp_server import LlamaServer, LlamaServerSpec

DRAFT_MAX, N_PREDICT = 3, 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.025, 0.03, 0.035, 0.04, 0.05])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    binary = llamacpp_build.build()
    with tempfile.TemporaryDirectory(prefix="gate-power-") as tmp:
        work = Path(tmp)
        models = llamacpp_models.write_all(work / "gguf")
        drafters = {n: llamacpp_models.write_drafter(work / "gguf" / f"drafter-{n:g}.gguf", n) for n in args.noise}
        spec = LlamaServerSpec(model=models["target"], drafter=drafters[args.noise[0]], draft_max=DRAFT_MAX)
        common = ["--engine", "llamacpp", "--max-tokens", str(N_PREDICT), "--timeout", "60"]
        reference = work / "reference.json"
        rows = []
        with LlamaServer(binary, spec, work / "engine") as server:
            url = ["--url", server.base_url]
            if cli_main(["gate", "record", *url, *common, "--out", str(reference)]) != 0:
                print("gate_power: recording the reference failed", file=sys.stderr)
                return 1
            for noise in args.noise:
                server.restart(server.spec.with_drafter(drafters[noise]))
                for run in range(args.runs):
                    out = work / f"gate-{noise:g}-{run}.json"
                    rc = cli_main(["gate", *url, *common, "--reference", str(reference), "--json", str(out)])
                    doc = json.loads(out.read_text())
                    rows.append((noise, run, rc, doc))
    print(f"\nreference: drafter noise {args.noise[0]:g}; built-in set; {N_PREDICT} tokens; draft_max {DRAFT_MAX}")
    print("| drafter noise | run | acceptance | drop | 95% interval | verdict |")
    print("|---|---|---|---|---|---|")
    for noise, run, rc, doc in rows:
        low, high = doc["drop_interval"]
        interval = f"{low:+.1%} to {high:+.1%}" if low is not None else "–"
        drop = f"{doc['drop']:+.1%}" if doc["drop"] is not None else "–"
        ratio = f"{doc['candidate_ratio']:.3f}" if doc["candidate_ratio"] is not None else "–"
        print(f"| {noise:g} | {run} | {ratio} | {drop} | {interval} | {doc['verdict']} (exit {rc}) |")
    failed = [doc["drop"] for _, _, rc, doc in rows if rc == 1]
    passed = [doc["drop"] for _, _, rc, doc in rows if rc == 0]
    print(f"smallest drop failed: {min(failed):.1%}" if failed else "no drop failed")
    print(f"largest drop passed: {max(passed):.1%}" if passed else "no run passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
