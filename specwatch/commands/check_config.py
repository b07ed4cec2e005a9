"""`specwatch check-config`: validate a config (and optionally a web config) and list every problem.

Exit status 0 with a summary when valid, 1 with every problem (each with its path) when not, like
`promtool check config`. A valid config may still get warnings (specwatch/config_warnings.py): files it cannot
read, inline secrets, routes whose GPUs the auto-mapping cannot find under the service's user. Where the state
directory holds a route's traffic (opened read-only), a route that pages a 20% drop later than its
`detection.horizon_budget` with no probe that is faster gets an ADVICE line: the probe config that covers it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.commands import add_config_file_argument
from specwatch import config_warnings, scrape_pool
from specwatch.config import ConfigError, load_config, summarize, unreadable_files
from specwatch.config import Config
from specwatch.config_schema import ProbeConfig, default_of
from specwatch.evaluators.acceptance_drop import stored_horizon
from specwatch.export.http import load_web_config
from specwatch.state.store import DB_NAME, StateStore
from specwatch.stats.horizon import PROBE_ROUND_GPU_SECONDS, PROBE_ROUNDS_TO_PAGE, human_seconds, probe_horizon

PROBE_DEFAULT_EVERY_SECONDS: float = default_of(ProbeConfig, "every_seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(parser)
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default="",
        metavar="FILE",
        help="also check this TLS / basic auth file",
    )
    parser.add_argument(
        "--service.user",
        dest="service_user",
        default=None,
        metavar="USER",
        help="the account the daemon runs as, for the GPU auto-mapping warning (default: "
        f"{config_warnings.SERVICE_USER} where that account exists, as the shipped unit runs as it; '' for none)",
    )


def main(args: argparse.Namespace) -> int:
    failed = False
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        _print_problems(args.config_file, exc)
        failed = True
    else:
        print(f"SUCCESS: {args.config_file} is valid")
        print(summarize(config))
        for problem in unreadable_files(config):  # read at scrape time, so not an error: the scrapes fail
            print(f"WARNING: {problem}", file=sys.stderr)
        for warning in config_warnings.warnings(config, args.service_user, scrape_pool.MAX_THREADS):
            print(f"WARNING: {warning}", file=sys.stderr)
        for advice in watch_advice(config):
            print(f"ADVICE: {advice}")
    if args.web_config_file:
        try:
            load_web_config(args.web_config_file)
        except ConfigError as exc:
            _print_problems(args.web_config_file, exc)
            failed = True
        else:
            print(f"SUCCESS: {args.web_config_file} is valid")
    return 1 if failed else 0


def watch_advice(config: Config) -> list[str]:
    """Per route whose traffic horizon, as the daemon last saved it in the state directory (opened read-only),
    exceeds `detection.horizon_budget` with no probe that pages within it: the probe that would cover it."""
    path = Path(config.state_dir) / DB_NAME
    if not path.is_file():
        return []
    store = StateStore(str(path), [], readonly=True, repair=False)
    try:
        out = []
        for route in config.routes:
            budget = route.detection.horizon_budget_seconds
            if route.probe is not None and probe_horizon(route.probe.every_seconds) <= budget:
                continue
            found = stored_horizon(store, route)
            if found is None or found[0] <= budget:
                continue
            out.append(probe_advice(route.name, found[0], found[1], budget))
        return out
    finally:
        store.close()


def probe_advice(route: str, horizon: float, drafted_per_second: float, budget: float) -> str:
    every = min(PROBE_DEFAULT_EVERY_SECONDS, budget / PROBE_ROUNDS_TO_PAGE)
    share = PROBE_ROUND_GPU_SECONDS / every
    h = human_seconds
    return (
        f"route {route}: at its last hour's traffic ({drafted_per_second:.1f} drafted tokens/s) a 20% acceptance "
        f"drop would page in about {h(horizon)}, more than detection.horizon_budget {h(budget)}, and no probe "
        f"covers it (alert SpecwatchRouteUnderWatched). Add to the route: `probe: {{every: {h(every)}}}` "
        f"(pages such a drop within {h(PROBE_ROUNDS_TO_PAGE * every)}; about {PROBE_ROUND_GPU_SECONDS:g} GPU-s "
        f"a round for an 8B model on an H200 at concurrency 1, {share:.1%} of one GPU; "
        "docs/runbook.md#specwatchrouteunderwatched scales it to the route's step time)"
    )


def _print_problems(path: str, exc: ConfigError) -> None:
    print(f"FAILED: {path}: {len(exc.problems)} problem(s)", file=sys.stderr)
    for problem in exc.problems:
        print(f"  - {problem}", file=sys.stderr)
