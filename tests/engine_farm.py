"""Many SIMULATED engines in one process, for end-to-end tests that need a fleet of them on a small machine.

    python tests/engine_farm.py FARM.json

FARM.json maps an engine's name to the arguments of `specwatch simulate` (`["--seed", "3", "--scenario",
"chat.yaml"]`; `--port` defaults to 0, a free one): each engine is what that command would serve (the
specwatch simulator: `X-Specwatch-Simulator: 1` on every answer, a `-simulated` version), on its own port,
with its own threads, all under one interpreter, so that two dozen of them cost one process, not two dozen.

Once every engine serves, one JSON line on stdout maps each name to its base URL. Then each stdin line
`{"engine": NAME, "event": {"type": ..., ...}}` applies a scenario event (specwatch/simulator/scenario.py's
types and keys, checked as strictly as in a scenario file) to that engine now, and is answered with one JSON
line `{"engine": NAME, "applied": TYPE}` or `{"error": ...}`. End of stdin, SIGTERM or SIGINT stop them all.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specwatch.commands import simulate  # noqa: E402 - after the path above
from specwatch.simulator.scenario import Scenario, ScenarioError, load_scenario, parse_scenario  # noqa: E402
from specwatch.simulator.server import RunningSimulator  # noqa: E402
from specwatch.simulator.simulation import Simulation  # noqa: E402


def start_engine(argv: list[str]) -> RunningSimulator:
    """One engine exactly as `specwatch simulate ARGV` builds it."""
    parser = argparse.ArgumentParser(prog="specwatch simulate")
    simulate.add_arguments(parser)
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario) if args.scenario else Scenario()
    spec = simulate.build_spec(args, scenario)
    return RunningSimulator(Simulation(spec), host=args.host, port=args.port or 0).start()


def apply(engines: dict[str, RunningSimulator], line: str) -> dict[str, str]:
    try:
        command = json.loads(line)
        name, raw = command["engine"], dict(command["event"])
        running = engines[name]
        # Scenario times are simulated seconds since the engine's start: "now" is its clock's present.
        (event,) = parse_scenario({"events": [{**raw, "at": running.simulation.clock.now()}]}).events
    except (ValueError, KeyError, TypeError, ScenarioError) as exc:
        return {"error": f"{line.strip()!r}: {type(exc).__name__}: {exc}"}
    running.simulation.apply(event)
    return {"engine": name, "applied": event.type}


def main() -> int:
    farm = json.loads(Path(sys.argv[1]).read_text())
    engines: dict[str, RunningSimulator] = {}
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for name, argv in farm.items():
            engines[name] = start_engine(list(argv))
        print(json.dumps({name: e.url for name, e in engines.items()}), flush=True)

        def commands() -> None:
            for line in sys.stdin:
                if line.strip():
                    print(json.dumps(apply(engines, line)), flush=True)
            stop.set()

        threading.Thread(target=commands, name="farm-commands", daemon=True).start()
        stop.wait()
    finally:
        for running in engines.values():
            running.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
