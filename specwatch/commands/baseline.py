"""`specwatch baseline list | show ROUTE | reset ROUTE | accept ROUTE`: operate on the baseline state file.

Works on the SQLite file directly, beside a running daemon (WAL) or with the daemon stopped. `list` and `show`
open it read-only (a read-only state directory works); no command moves or repairs a bad file, the daemon does.
`reset` and `accept` also queue a command that a running daemon picks up within ~10 s (`COMMAND_POLL_SECONDS`);
a stopped daemon applies the written state when it starts.

- reset ROUTE: forget every baseline and the detector state of ROUTE; it learns again from scratch.
- accept ROUTE: adopt the current model's acceptance after a deliberate change: once the daemon has seen at
  least `warmup_drafted_tokens` of it (as of its last save, every 60 s), that traffic becomes the baseline at
  once. Without that evidence it refuses and changes nothing; it never deletes a baseline. For a fleet, and
  decided on each daemon's live state, use `specwatch fleet accept --model NAME`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from specwatch.commands import add_state_dir_argument
from specwatch.commands._owner import baseline_argv, refuse_unless_owner
from specwatch.config import DEFAULT_CONFIG_PATH, DEFAULT_STATE_DIR, ConfigError, DetectionConfig, load_config
from specwatch.state.baselines import Baseline, BaselineKey, BaselineLearner
from specwatch.state.store import DB_NAME, StateStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config.file",
        dest="config_file",
        default=None,
        help=f"config file whose state_dir to use (default {DEFAULT_CONFIG_PATH} when it exists)",
    )
    add_state_dir_argument(parser, f"state directory (default: the config's state_dir, else {DEFAULT_STATE_DIR})")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="list every route's baselines")
    for name, help_ in (
        ("show", "show one route's baselines and detector state"),
        ("reset", "forget a route's baselines; it relearns from scratch"),
        ("accept", "adopt the current model's acceptance as the route's baseline"),
    ):
        sub.add_parser(name, help=help_).add_argument("route", metavar="ROUTE")


def main(args: argparse.Namespace) -> int:
    try:
        state_dir, detection = _resolve(args)
    except ConfigError as exc:
        print(f"specwatch baseline: {exc}", file=sys.stderr)
        return 2
    path = Path(state_dir) / DB_NAME
    if args.action in ("reset", "accept") and refuse_unless_owner("specwatch baseline", state_dir, baseline_argv(args)):
        return 1
    if args.action in ("list", "show") and not path.exists():
        print(f"specwatch baseline: no state file at {path} (is --state.dir right?)", file=sys.stderr)
        return 1
    errors: list[str] = []
    # only the daemon repairs the file (moves a corrupt one aside): a command must not pull it from under it
    store = StateStore(str(path), errors, readonly=args.action in ("list", "show"), repair=False)
    try:
        if args.action == "list":
            rc = _list(store)
        elif args.action == "show":
            rc = _show(store, args.route)
        elif args.action == "reset":
            rc = _reset(store, args.route)
        else:
            rc = _accept(store, args.route, detection(args.route))
    finally:
        store.close()
    for e in errors:
        print(f"specwatch baseline: state error: {e}", file=sys.stderr)
    return rc or (1 if errors else 0)


def _resolve(args: argparse.Namespace):
    """(state dir, route name -> DetectionConfig) from the flags and the config file."""
    config_path = args.config_file or (DEFAULT_CONFIG_PATH if Path(DEFAULT_CONFIG_PATH).exists() else None)
    config = load_config(config_path) if config_path else None
    state_dir = args.state_dir or (config.state_dir if config else DEFAULT_STATE_DIR)

    def detection(route: str) -> DetectionConfig:
        if config is None:
            return DetectionConfig()
        r = config.route(route)
        return r.detection if r else config.detection

    return state_dir, detection


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _baseline_row(b: Baseline) -> list[str]:
    return [
        b.route,
        b.key.model_name or "-",
        b.key.engine_version or "-",
        str(b.key.k or "?"),
        f"{b.acceptance_ratio:.4f}",
        f"{b.mean_acceptance_length:.3f}" if b.mean_acceptance_length else "-",
        f"{b.overdispersion:.1f}",
        f"{b.drafted_tokens:.0f}",
        b.source,
        "pinned" if b.pinned else "refining",
        _when(b.updated),
    ]


_HEADER = ["ROUTE", "MODEL", "VERSION", "K", "RATIO", "TAU", "PHI", "TOKENS", "SOURCE", "STATE", "UPDATED"]


def _list(store: StateStore) -> int:
    rows = [_HEADER]
    with_baseline = set()
    for b in store.baselines():
        rows.append(_baseline_row(b))
        with_baseline.add(b.route)
    for route in store.routes():
        if route not in with_baseline:
            rows.append([route] + ["-"] * 8 + ["learning", "-"])
    if len(rows) == 1:
        if not store.errors:  # an unreadable file is not an empty one
            print("no baselines yet")
        return 0
    print(_table(rows))
    return 0


def _show(store: StateStore, route: str) -> int:
    baselines = store.baselines(route)
    state = store.route_state(route)
    if not baselines and state is None:
        print(f"specwatch baseline: no baseline or state for route {route!r}", file=sys.stderr)
        return 1
    if baselines:
        print(_table([_HEADER] + [_baseline_row(b) for b in baselines]))
        for b in baselines:
            if b.position_acceptance:
                print(
                    f"  {b.key.label()}: per-position acceptance "
                    + ", ".join(f"p{j + 1}={p:.3f}" for j, p in enumerate(b.position_acceptance))
                )
    if state:
        key = state.get("key")
        ref = state.get("reference_key")
        learner = state.get("learner") or {}
        cusum = state.get("cusum") or [0.0, None, 0.0]
        sprt = state.get("sprt")
        print(f"current model:     {_key_label(key)}")
        print(f"reference:         {_key_label(ref) if ref else 'none (learning)'}")
        print(f"degraded:          {'yes' if state.get('degraded') else 'no'}")
        print(f"cusum statistic:   {float(cusum[0]):.2f}")
        if sprt:
            print(f"change verdict:    SPRT {sprt[2]} (llr {float(sprt[0]):.2f} over {float(sprt[1]):.0f} tokens)")
        last_change = _when(state.get("last_model_change"))
        print(f"model changes:     {state.get('model_changes_total', 0)} (last {last_change})")
        print(f"learning sample:   {float(learner.get('drafted', 0.0)):.0f} drafted tokens of the current model")
    return 0


def _key_label(raw) -> str:
    try:
        return BaselineKey.from_json(raw).label()
    except (TypeError, ValueError, IndexError):
        return "?"


def _reset(store: StateStore, route: str) -> int:
    return _report(reset_route(store, route))


def _accept(store: StateStore, route: str, detection: DetectionConfig) -> int:
    return _report(accept_route(store, route, detection))


def _report(outcome: tuple[bool, str]) -> int:
    ok, message = outcome
    if not ok:
        if message:
            print(f"specwatch baseline: {message}", file=sys.stderr)
        return 1
    print(message if message.endswith(NOTHING_CHANGED) else message + " (a running daemon applies it within ~10 s)")
    return 0


NOTHING_CHANGED = "nothing changed"


def reset_route(store: StateStore, route: str) -> tuple[bool, str]:
    """Forget the route's baselines and queue "reset" for the daemon; (done, what was done or why not).
    The one implementation of `reset`, for the CLI and the daemon's HTTP API."""
    if not store.delete_route(route) or not store.append_command(route, "reset"):
        return False, ""
    return True, f"route {route}: baselines and detector state deleted; it relearns from scratch"


def accept_route(store: StateStore, route: str, detection: DetectionConfig) -> tuple[bool, str]:
    """Adopt the current model's traffic as its baseline and queue "accept"; (done, what was done or why not).
    The state file's accept, for the CLI beside a running or a stopped daemon (a running daemon's baselines API
    decides on its live state instead). Never deletes: without evidence for the current key it refuses."""
    state = store.route_state(route)
    if state is None or not state.get("key"):
        return False, f"route {route!r} has no detector state yet (has the daemon seen it?)"
    key = BaselineKey.from_json(state["key"])
    ref = state.get("reference_key")
    try:
        learner = BaselineLearner.from_json(state["learner"], detection.block_seconds)
    except (KeyError, TypeError, ValueError) as exc:
        return False, f"unreadable detector state of {route!r}: {exc!r}"
    if ref is not None and list(ref) == list(state["key"]) and store.get(route, key) is not None:
        return True, f"route {route}: {key.label()} already has its own baseline; {NOTHING_CHANGED}"
    now = store.clock()
    if not learner.has(now, detection.warmup_drafted_tokens, 0.0):
        return False, (
            f"route {route}: no evidence for {key.label()} yet ({learner.drafted:.0f} of "
            f"{detection.warmup_drafted_tokens:.0f} drafted tokens as of the daemon's last save); nothing changed. "
            f"To forget its baselines and relearn from scratch: specwatch baseline reset {route}"
        )
    baseline = learner.baseline(route, key, now, "accepted", pinned=False)
    if not store.put(baseline) or not store.append_command(route, "accept"):
        return False, ""
    return True, (
        f"route {route}: accepted {baseline.acceptance_ratio:.4f} for {key.label()} from "
        f"{baseline.drafted_tokens:.0f} drafted tokens"
    )
