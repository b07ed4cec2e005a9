"""`specwatch demo`: SIMULATED engines and a real specwatch daemon together, with a live status table.

No config, no GPU, no network beyond loopback. Starts the engines of the packaged demo plan (a simulated
vLLM with 2 DP engines and a simulated SGLang), runs the daemon in-process against them with a generated
config (state in a temporary directory), prints the URLs, and refreshes the status table until Ctrl-C or
`--duration` seconds.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console, Group
from rich.live import Live
from rich.logging import RichHandler
from rich.text import Text

import specwatch
from specwatch.commands import add_state_dir_argument
from specwatch.commands.status import render_status_table
from specwatch.config import ConfigError, parse_config
from specwatch.daemon import Daemon
from specwatch.export.http import routes_document, serve
from specwatch.scheduler import start_scheduler
from specwatch.simulator.demo_plan import daemon_config, load_demo_plan, simulation_spec
from specwatch.simulator.launch import start_inprocess
from specwatch.simulator.server import RunningSimulator

NON_TTY_PRINT_EVERY_SECONDS = 15.0  # scripted runs: a table every so often, not a redraw every second


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=0.0, help="stop after this many seconds (default: run until Ctrl-C)"
    )
    parser.add_argument(
        "--time-scale", type=float, help="simulated engines run S x real time (default: the plan's, 10)"
    )
    parser.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default="127.0.0.1:0",
        help="where the daemon serves /metrics and /api/v1/routes (default: a free loopback port)",
    )
    parser.add_argument("--refresh", type=float, default=1.0, help="status table refresh interval, seconds")
    add_state_dir_argument(parser, "baseline state directory (default: a temporary one, removed at exit)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the simulated engines (default 1)")
    parser.add_argument(
        "--real",
        nargs="?",
        const="vllm",
        choices=("vllm", "llamacpp"),
        help="a REAL engine instead of the simulators: vLLM (the default; CPU build, installed into "
        "~/.cache/specwatch on first use) or llamacpp (llama-server, built once into ~/.cache/specwatch); both need a "
        "source checkout: its drafter is swapped for a worse one and the route turns degraded",
    )
    parser.add_argument(
        "--bump-after", type=float, default=90.0, help="with --real: seconds before the drafter is swapped (default 90)"
    )


def main(args: argparse.Namespace) -> int:
    # Ctrl-C asks the demo to stop; it never raises. A KeyboardInterrupt landing in the cleanup or the final
    # print would cut them short (and engine or scheduler threads left running keep the process alive), and
    # an impatient user presses Ctrl-C again and again. The handler is put back once everything has finished.
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # started in the background by a shell: leave Ctrl-C ignored, as asked
        signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    try:
        if args.real:
            return _run_real(args, stop)
        return _run(args, stop)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace, stop: threading.Event) -> int:
    plan = load_demo_plan()
    time_scale = args.time_scale or plan.time_scale
    console = _console()
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # one line per tick would drown the table
    sims: dict[str, RunningSimulator] = {}
    daemon = server = scheduler = None
    final = None
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if not args.state_dir:
        tmp = tempfile.TemporaryDirectory(prefix="specwatch-demo-")
    try:
        specs = {r.name: simulation_spec(r, time_scale, seed=args.seed + 100 * i) for i, r in enumerate(plan.routes)}
        for route in plan.routes:
            sims[route.name] = start_inprocess(specs[route.name])
        raw = daemon_config(
            plan, {n: s.url + "/metrics" for n, s in sims.items()}, specs, args.state_dir or (tmp.name if tmp else "")
        )
        config = parse_config(raw, "demo config")
        daemon = Daemon(config)
        server = serve(args.listen_address, lambda: daemon.snapshot)
        daemon.tick()
        scheduler = start_scheduler(daemon, config.interval_seconds)
        _banner(console, plan.description, sims, server.url, time_scale)
        _watch(console, daemon, lambda doc: _frame(doc, sims), args.duration, args.refresh, stop)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"specwatch demo: {exc}", file=sys.stderr)
        return 1
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=True)
        if daemon is not None:
            final = daemon.snapshot
        for sim in sims.values():
            sim.stop()
        if server is not None:
            server.shutdown()
        if daemon is not None:
            daemon.close()
        if tmp is not None:
            tmp.cleanup()
    if final is not None:
        console.print(_frame(routes_document(final), sims, final=True))
    return 0


def _banner(
    console: Console, description: str, sims: dict[str, RunningSimulator], daemon_url: str, time_scale: float
) -> None:
    console.print(Text("specwatch demo: SIMULATED engines (specwatch simulator), no GPU involved", style="bold"))
    if description:
        console.print(description)
    for name, sim in sims.items():
        s = sim.simulation
        console.print(f"  route {name}: SIMULATED {s.kind} {s.version}, {len(s.engines)} engine(s), {sim.url}/metrics")
    console.print(
        f"  daemon: {daemon_url}/metrics  {daemon_url}/api/v1/routes  "
        f"(engines run {time_scale:g}x real time; Ctrl-C to stop)"
    )


def testbed_checkout() -> Path | None:
    """The source checkout this specwatch was imported from, where it holds the testbed; None for a wheel.

    The real engine's testbed (`testbed/` beside `specwatch/`) is not packaged: it builds a 3.5 GB engine venv and
    models inside the checkout. An editable install (`scripts/bootstrap.sh`) imports specwatch from there.
    """
    root = Path(specwatch.__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "testbed" / "real_demo.py").is_file():
        return root
    return None


def _run_real(args: argparse.Namespace, stop: threading.Event) -> int:
    root = testbed_checkout()
    if root is None:
        print(
            "specwatch demo --real: the real-engine testbed is not part of the installed package; it runs from a "
            "source checkout only: clone the specwatch repository and run `scripts/demo.sh --real` there "
            "(plain `specwatch demo` runs the simulated engines from any install)",
            file=sys.stderr,
        )
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from testbed.engine_env import EngineEnvError
    from testbed.vllm_server import VllmServerError

    if args.real == "llamacpp":
        from testbed.llamacpp_demo import run_real_demo
    else:
        from testbed.real_demo import run_real_demo

    console = _console()
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        return run_real_demo(
            console,
            args.listen_address,
            args.duration,
            args.bump_after,
            stop,
            lambda daemon, frame: _watch(console, daemon, frame, args.duration, args.refresh, stop),
            state_dir=args.state_dir,
        )
    except (EngineEnvError, VllmServerError, RuntimeError, OSError) as exc:
        print(f"specwatch demo --real: {exc}", file=sys.stderr)
        return 1


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160)  # logs and CI: room for every column


def _watch(
    console: Console,
    daemon: Daemon,
    frame: Callable[[dict[str, Any]], Group],
    duration: float,
    refresh: float,
    stop: threading.Event,
) -> None:
    """Refresh the table until `stop` is set (Ctrl-C) or `duration` seconds have passed."""
    deadline = time.monotonic() + duration if duration > 0 else None

    def running() -> bool:
        return not stop.is_set() and (deadline is None or time.monotonic() < deadline)

    if console.is_terminal:
        # Log lines (a detected drop, an engine restart) print above the live table instead of through it.
        root = logging.getLogger()
        saved = root.handlers[:]
        root.handlers = [RichHandler(console=console, show_path=False)]
        try:
            with Live(frame(routes_document(daemon.snapshot)), console=console, auto_refresh=False) as live:
                while running():
                    stop.wait(_nap(refresh, deadline))
                    live.update(frame(routes_document(daemon.snapshot)), refresh=True)
        finally:
            root.handlers = saved
        return
    next_print = time.monotonic() + NON_TTY_PRINT_EVERY_SECONDS
    while running():
        stop.wait(_nap(refresh, deadline))
        if time.monotonic() >= next_print:
            console.print(frame(routes_document(daemon.snapshot)))
            next_print += NON_TTY_PRINT_EVERY_SECONDS


def _nap(refresh: float, deadline: float | None) -> float:
    if deadline is None:
        return refresh
    return max(0.0, min(refresh, deadline - time.monotonic()))


def _frame(doc: dict[str, Any], sims: dict[str, RunningSimulator], final: bool = False) -> Group:
    clocks = ", ".join(
        f"{name} t={sim.simulation.clock.now() / 60:.1f} min offered "
        f"{sim.simulation.status()['offered_concurrency']:.0f}"
        for name, sim in sims.items()
    )
    head = Text(("final state" if final else "live") + f" (simulated engines: {clocks})", style="dim")
    return Group(render_status_table(doc), head)
