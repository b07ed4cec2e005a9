"""`specwatch probe ROUTE`: one canary round now, as a per-prompt table against the route's fingerprint.

The route's engine is scraped once for its key (model, engine version, k, drafter); the round is sent as the daemon
would send it (the route's `probe:` settings, or the defaults when it has none); each prompt's acceptance
and accepted length are shown beside its fingerprint's. The fingerprint is read from the daemon's state
directory: the key's own, else the one the daemon judges this route against. `--adopt` stores this round as
the key's fingerprint (after an intended model or drafter change); the daemon reads it at its next round.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from specwatch.commands import add_config_file_argument
from specwatch.commands._owner import refuse_unless_owner
from specwatch.config import ConfigError, ProbeConfig, load_config
from specwatch.evaluators.canary import bracket_scraper
from specwatch.probe.prompts import PromptSetError, load_prompt_set
from specwatch.probe.responses import Acceptance
from specwatch.probe.runner import ProbeRunner
from specwatch.probe.verdict import compare
from specwatch.sources.base import SourceError
from specwatch.sources.engines import make_source
from specwatch.state.baselines import BaselineKey
from specwatch.state.store import StateStore

_DASH = "–"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("route", help="route name from the config")
    add_config_file_argument(parser)
    parser.add_argument(
        "--adopt",
        action="store_true",
        help="store this round as the fingerprint of the route's current model, version and k",
    )


def main(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        print(f"specwatch probe: {exc}", file=sys.stderr)
        return 2
    route = config.route(args.route)
    if route is None:
        names = ", ".join(r.name for r in config.routes) or "none"
        print(f"specwatch probe: no route {args.route!r} in {args.config_file} (routes: {names})", file=sys.stderr)
        return 2
    argv = ["probe", route.name, "--config.file", args.config_file, "--adopt"]
    if args.adopt and refuse_unless_owner("specwatch probe", config.state_dir, argv):
        return 1
    probe = route.probe or ProbeConfig()
    try:
        prompt_set = load_prompt_set(probe.prompts)
    except PromptSetError as exc:
        print(f"specwatch probe: {exc}", file=sys.stderr)
        return 2
    source = make_source(route, config)
    try:
        sample = source.sample(time.time())
    except SourceError as exc:
        print(f"specwatch probe: cannot scrape route {route.name} at {route.url}: {exc}", file=sys.stderr)
        return 1
    finally:
        source.close()
    key = BaselineKey(sample.model_name, sample.engine_version, int(sample.num_speculative_tokens or 0), sample.drafter)
    runner = ProbeRunner(
        route,
        probe,
        prompt_set,
        engine_kind=lambda: sample.engine_kind.split("-")[0],
        scrape=bracket_scraper(route, config),
    )
    console = Console()
    console.print(
        f"route [bold]{route.name}[/bold] ({key.label()}): {len(prompt_set.prompts)} prompts of "
        f"{prompt_set.name} ({prompt_set.hash}), max_tokens {probe.max_tokens}, greedy"
    )
    rnd = runner.run_now()
    if rnd.outcome != "ok":
        print(f"specwatch probe: round {rnd.outcome} after {rnd.duration_seconds:.1f}s: {rnd.message}", file=sys.stderr)
        return 1

    store = StateStore.in_state_dir(config.state_dir, repair=False)  # only the daemon repairs the file
    try:
        reference_key = key
        fingerprint = store.fingerprint(route.name, key, prompt_set.hash)
        if not fingerprint:
            state = store.probe_state(route.name) or {}
            ref = state.get("reference_key")
            if ref and state.get("prompt_set") == prompt_set.hash:
                reference_key = BaselineKey.from_json(ref)
                fingerprint = store.fingerprint(route.name, reference_key, prompt_set.hash)
        reference = {pid: Acceptance(d, a, s) for pid, (d, a, s) in fingerprint.items()}
        console.print(_table(rnd, reference))
        totals = rnd.totals()
        line = (
            f"method {rnd.method}, {rnd.message}, {rnd.duration_seconds:.1f}s; acceptance "
            f"{_ratio(totals.ratio)}, accepted length {_number(totals.mean_length)}"
        )
        comparison = compare(rnd.read(), reference, route.detection.drop) if reference else None
        if comparison is not None:
            verdict = "LOW" if comparison.low else ("clean" if comparison.clean else "between")
            line += (
                f"; against the fingerprint of {reference_key.label()}: {_ratio(comparison.reference_ratio)}, "
                f"drop {comparison.drop:+.1%} over {comparison.paired} prompts, paired z {comparison.z:.1f} "
                f"-> {verdict} (drop {route.detection.drop:g})"
            )
        elif not reference:
            line += "; no fingerprint yet for this route and prompt set"
        console.print(line)
        if args.adopt:
            usable = {pid: (a.drafted, a.accepted, a.steps) for pid, a in rnd.read().items() if a.drafted > 0}
            if not usable or not store.put_fingerprint(route.name, key, prompt_set.hash, usable):
                print("specwatch probe: could not store the fingerprint", file=sys.stderr)
                return 1
            store.put_probe_state(
                route.name,
                {
                    **(store.probe_state(route.name) or {}),
                    "version": 1,
                    "prompt_set": prompt_set.hash,
                    "reference_key": key.to_json(),
                    "low_rounds": 0,
                    "clean_rounds": 0,
                    "degraded": False,
                    "not_low_on_new_key": 0,
                },
            )
            console.print(f"adopted as the fingerprint of {key.label()} ({len(usable)} prompts)")
    finally:
        store.close()
    return 0


def _table(rnd, reference: dict[str, Acceptance]) -> Table:
    table = Table(title="canary round", title_justify="left")
    table.add_column("prompt", no_wrap=True)  # ids are what an operator greps for: never cut them
    for name, justify in (
        ("kind", "left"),
        ("acceptance", "right"),
        ("accepted length", "right"),
        ("fingerprint", "right"),
        ("change", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for p in rnd.prompts:
        a = p.acceptance
        if a is None:
            table.add_row(p.prompt_id, p.kind, _DASH, _DASH, _DASH, p.error[:60])
            continue
        ref = reference.get(p.prompt_id)
        change = _DASH
        if ref is not None and ref.ratio and a.ratio is not None:
            change = f"{a.ratio / ref.ratio - 1:+.1%}"
        table.add_row(
            p.prompt_id, p.kind, _ratio(a.ratio), _number(a.mean_length), _ratio(ref.ratio if ref else None), change
        )
    return table


def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else _DASH


def _number(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else _DASH
