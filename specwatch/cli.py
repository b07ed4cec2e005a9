"""Command-line entry point. Each subcommand lives in `specwatch/commands/<module>.py` and exposes
`add_arguments(parser)` and `main(args) -> int`; this file only wires them, imported lazily so that
`specwatch --help` stays fast and one command's heavy imports (matplotlib, NVML) never slow another."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from specwatch import __version__, logsetup

# Third-party modules that only offline tools use, and the extra that installs each (pyproject.toml).
OPTIONAL_DEPENDENCIES = {"matplotlib": "plot", "grafanalib": "mixin"}

# name -> (module under specwatch.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "run the daemon: scrape engines and NVML, detect, export /metrics"),
    "check-config": ("check_config", "validate a config file and list every problem"),
    "status": ("status", "show a running daemon's routes as a table"),
    "simulate": ("simulate", "serve a SIMULATED vLLM or SGLang engine (metrics + OpenAI API)"),
    "demo": ("demo", "run simulated engines and the daemon together, with a live status table"),
    "baseline": ("baseline", "list, show, reset or accept per-route acceptance baselines"),
    "fleet": ("fleet", "accept a model bump on every node of a fleet, where each node runs it"),
    "replay": ("replay", "run the detection pipeline offline over a JSONL trace of scrapes"),
    "backtest": ("backtest", "replay a route's counters pulled from a Prometheus server"),
    "simulate-trace": ("simulate_trace", "write a realistic SIMULATED acceptance trace (JSONL)"),
    "sweep": ("sweep", "measure the crossover: drive a plain and a spec server at rising concurrency"),
    "crossover": ("crossover", "estimate the crossover batch size from a calibrated roofline"),
    "recommend": ("recommend", "recommend a draft length and a batch-size schedule for a route"),
    "probe": ("probe", "send one canary probe round to a route now and compare it with its fingerprint"),
    "generate": ("generate", "write (or --check) the alert rules and Grafana dashboards"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (with `only`) one whose single chosen subcommand has its arguments loaded, so a
    command never imports another's dependencies (grafanalib, matplotlib, the simulator)."""
    parser = argparse.ArgumentParser(
        prog="specwatch",
        description="Speculative-decoding monitor for vLLM, SGLang, TensorRT-LLM and llama.cpp inference nodes.",
    )
    parser.add_argument("--version", action="version", version=f"specwatch {__version__}")
    logsetup.add_flags(parser, on_subcommand=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        logsetup.add_flags(p, on_subcommand=True)
        if only is not None and name != only:
            continue
        _load(module).add_arguments(p)
    return parser


def _load(module: str) -> Any:
    return importlib.import_module(f"specwatch.commands.{module}")


def _chosen_command(argv: list[str]) -> str:
    """The subcommand named on the command line ("" when none), found without importing any command."""
    for arg in argv:
        if arg in COMMANDS:
            return arg
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = _chosen_command(argv)
    try:
        return _run(argv, chosen)
    except ModuleNotFoundError as exc:
        extra = OPTIONAL_DEPENDENCIES.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"specwatch {chosen}: needs {exc.name}, which the daemon does not: pip install 'specwatch[{extra}]'",
            file=sys.stderr,
        )
        return 2


def _run(argv: list[str], chosen: str) -> int:
    parser = build_parser(only=chosen)
    args = parser.parse_args(argv)
    logsetup.configure(args)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    mod = _load(args._module)
    try:
        return int(mod.main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do (Python docs' recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
