"""`specwatch status`: a running daemon's routes as a table (from its /api/v1/routes).

Credentials and TLS come from `--http.config.file` (default `$SPECWATCH_HTTP_CONFIG_FILE`), a YAML file of
the keys a route takes (`basic_auth` with `password_file`, `tls_config` with `ca_file`, ...), as promtool's
flag: never from the URL, where a password would be in the shell history and in `ps`.

`render_status_table()` is reusable: the demo renders the same table from the same JSON.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import ssl
import sys
import time
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

import requests
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from specwatch.config import DEFAULT_HTTP_CLIENT, ConfigError, HttpClientConfig, load_http_client_config
from specwatch.export.http import DEFAULT_LISTEN_ADDRESS
from specwatch.sources.http import client_session
from specwatch.stats.horizon import human_seconds

DEFAULT_URL = f"http://{DEFAULT_LISTEN_ADDRESS}"
HTTP_CONFIG_ENV = "SPECWATCH_HTTP_CONFIG_FILE"
_DASH = "–"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the daemon's base URL, http or https (default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--http.config.file",
        dest="http_config_file",
        default=os.environ.get(HTTP_CONFIG_ENV, ""),
        metavar="FILE",
        help="YAML with basic_auth (username, password_file), authorization, tls_config (ca_file, ...) and "
        f"headers, as a route's keys, to reach a daemon behind --web.config.file (default ${HTTP_CONFIG_ENV})",
    )
    parser.add_argument("--watch", action="store_true", help="refresh until interrupted")
    parser.add_argument("--interval", type=float, default=2.0, help="refresh interval with --watch, seconds")
    parser.add_argument("--timeout", type=float, default=3.0, help="HTTP timeout, seconds")


class Unreachable(Exception):
    """The daemon did not answer usefully; the message says what to check."""


def fetch_routes(url: str, timeout: float = 3.0, session: requests.Session | None = None) -> dict[str, Any]:
    api = url.rstrip("/") + "/api/v1/routes"
    try:
        response = (session or requests).get(api, timeout=timeout, headers={"Accept": "application/json"})
    except (requests.exceptions.InvalidHeader, requests.exceptions.SSLError) as exc:
        raise Unreachable(f"{api}: {exc}; check --http.config.file") from exc  # a secret file, the CA
    except requests.RequestException as exc:
        if url.startswith("http://") and _speaks_tls(url, timeout):  # the server closed plain HTTP unanswered
            raise Unreachable(f"{api}: this port serves TLS; use --url https://{url.removeprefix('http://')}") from exc
        raise Unreachable(
            f"cannot reach specwatch at {url}: {exc.__class__.__name__}. Is `specwatch run` "
            f"running and listening there (--web.listen-address)?"
        ) from exc
    if response.status_code == 401:
        raise Unreachable(f"{api}: 401 unauthorized; give basic_auth in a --http.config.file")
    if response.status_code != 200:
        raise Unreachable(f"{api}: HTTP {response.status_code}")
    try:
        doc = response.json()
    except ValueError as exc:
        raise Unreachable(f"{api}: not JSON; is this a specwatch daemon?") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("routes"), list):
        raise Unreachable(f"{api}: unexpected JSON; is this a specwatch daemon?")
    return doc


def _speaks_tls(url: str, timeout: float) -> bool:
    """Whether the URL's port answers a TLS handshake (its certificate unchecked: this only names the mistake)."""
    parts = urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((parts.hostname or "localhost", parts.port or 80), timeout=timeout) as raw:
            with context.wrap_socket(raw):
                return True
    except ssl.SSLError as exc:  # a handshake refused for a client certificate is TLS too
        return "WRONG_VERSION_NUMBER" not in str(exc)
    except OSError:
        return False


def _ratio(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else _DASH


def _number(value: Any, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else _DASH


def _hours(seconds: Any) -> str:
    """GPU-seconds as GPU-hours since the daemon started (the counters' lifetime)."""
    return f"{seconds / 3600:.2f}" if isinstance(seconds, (int, float)) else _DASH


def _watch(r: Mapping[str, Any]) -> Text:
    """The shorter of the traffic and probe horizons; `(probe)` when the probes are the faster path, red past the
    route's horizon budget."""
    paths = [
        (v, name) for name in ("traffic", "probe") if isinstance(v := r.get(f"{name}_horizon_seconds"), (int, float))
    ]
    if not paths:
        return Text(_DASH)
    seconds, path = min(paths)
    budget = r.get("horizon_budget_seconds")
    over = isinstance(budget, (int, float)) and seconds > budget
    return Text(human_seconds(seconds) + (" probe" if path == "probe" else ""), style="bold yellow" if over else "")


def _cell(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="ellipsis")


def _any(routes: Sequence[Mapping[str, Any]], *keys: str) -> bool:
    return any(r.get(k) is not None for r in routes for k in keys)


# Columns dropped, first to last, when the table does not fit the terminal: route, up, acceptance and the
# verdict always stay (the verdict still says DEGRADED or ABOVE when baseline or batch columns are gone).
# "watch" (how soon a 20% drop would page) outlives the engine and model: it says whether the verdict can be trusted.
DROP_ORDER = ("GPU-h lost/saved", "run/wait", "len", "k", "engine", "model", "watch", "batch/xover", "baseline drop")
# Engine and model may be shortened with an ellipsis down to these widths before anything is dropped.
_SHRINKABLE = {"engine": (22, 10), "model": (32, 12)}


def _columns(routes: Sequence[Mapping[str, Any]]) -> list[str]:
    detection = _any(routes, "baseline_ratio", "drop_ratio", "degraded")
    crossover = _any(routes, "crossover_batch_size", "batch_size", "above_crossover")
    ledger = _any(routes, "speculation_gpu_seconds_lost_total", "speculation_gpu_seconds_saved_total")
    watch = _any(routes, "traffic_horizon_seconds", "probe_horizon_seconds")
    columns = ["route", "up", "engine", "model", "accept 1m 5m 1h", "len", "k", "run/wait"]
    columns += ["baseline drop"] * detection + ["watch"] * watch
    columns += ["batch/xover"] * crossover + ["GPU-h lost/saved"] * ledger
    return columns + ["verdict"] * (detection or crossover)


def _row(r: Mapping[str, Any]) -> dict[str, Any]:
    """Every cell of a route's row, by column header."""
    ratios = r.get("acceptance_ratio") or {}
    lengths = r.get("mean_acceptance_length") or {}
    up = (
        Text("up", style="green")
        if r.get("up")
        else Text(f"DOWN {r.get('error_reason') or ''}".strip(), style="bold red")
    )
    engine = " ".join(x for x in (r.get("engine_kind"), r.get("engine_version")) if x) or _DASH
    mark = "*" if r.get("acceptance_source") in ("gauge", "lifetime_gauge") else ""  # * = from gauges
    drop = r.get("drop_ratio")
    lost, saved = r.get("speculation_gpu_seconds_lost_total"), r.get("speculation_gpu_seconds_saved_total")
    verdict = Text()
    if r.get("degraded"):
        verdict.append("DEGRADED ", style="bold red")
    if r.get("above_crossover"):
        verdict.append("ABOVE ", style="bold yellow")
    return {
        "route": str(r.get("name", "?")),
        "up": up,
        "engine": _cell(engine),
        "model": _cell(" ".join(x for x in (r.get("model_name"), r.get("drafter")) if x) or _DASH),
        "accept 1m 5m 1h": " ".join(_ratio(ratios[w]) + mark if w in ratios else _DASH for w in ("1m", "5m", "1h")),
        "len": _number(lengths.get("5m", lengths.get("1m")), 2),
        "k": _draft_length(r),
        "run/wait": f"{_number(r.get('running_requests'), 0)}/{_number(r.get('waiting_requests'), 0)}",
        "baseline drop": f"{_ratio(r.get('baseline_ratio'))} "
        + (f"{-drop * 100:+.1f}%" if isinstance(drop, (int, float)) else _DASH),
        "watch": _watch(r),
        "batch/xover": f"{_number(r.get('batch_size'), 1)}/{_number(r.get('crossover_batch_size'), 1)}{_flag(r)}",
        "GPU-h lost/saved": f"{_hours(lost)}/{_hours(saved)}",
        "verdict": verdict if verdict.plain else Text("ok", style="green") if r.get("up") else Text(_DASH),
    }


def _draft_length(r: Mapping[str, Any]) -> str:
    """The effective draft length, followed by what it counts where the engine counts no draft tokens itself
    (SGLang: chain, tree, block, dspark_cap, adaptive)."""
    basis = str(r.get("draft_length_basis") or "")
    return f"{_number(r.get('draft_length'), 1)} {basis}" if basis else _number(r.get("draft_length"), 1)


def _not_comparable(r: Mapping[str, Any]) -> Text:
    positions = ", ".join(_ratio(p) for p in r.get("position_acceptance_ratio") or ())
    return Text.assemble(
        (f"{r.get('name', '?')}: ", "bold"),
        ("per-position acceptance not comparable: ", "yellow"),
        f"drafts shorter than k (draft length {_number(r.get('draft_length'), 2)}) count as rejections at "
        f"positions they never drafted ({positions})",
    )


def _table(columns: list[str], rows: list[dict[str, Any]], caption: str, narrowest: bool = False) -> Table:
    table = Table(title="specwatch routes", caption=caption, header_style="bold")
    for header in columns:
        if header in _SHRINKABLE:
            widest, narrow = _SHRINKABLE[header]
            table.add_column(header, max_width=narrow if narrowest else widest)
        elif header in ("route", "up", "verdict"):
            table.add_column(header, style="bold" if header == "route" else None, no_wrap=True)
        else:
            table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(row[header] for header in columns))
    return table


def _width_needed(table: Table) -> int:
    console = Console(width=10_000, file=io.StringIO())
    return Measurement.get(console, console.options, table).maximum


def render_status_table(
    routes_json: Mapping[str, Any] | Sequence[Mapping[str, Any]], width: int | None = None
) -> Table:
    """A rich Table of routes, from the /api/v1/routes document (or its `routes` list).

    The baseline column appears when any route has a baseline or a verdict, batch/crossover when any has a
    crossover or a batch size, GPU-hours lost/saved by speculation (since the daemon started) when any route's
    crossover source predicts a speedup, "watch" (the shorter detection horizon, traffic or probe: how soon a 20%
    drop would page; yellow past the route's budget) when any route has one, and then a verdict column (DEGRADED,
    ABOVE the crossover, or ok).
    With `width` (the terminal's), nothing is cut silently: engine and model are shortened with an ellipsis,
    then columns are dropped in `DROP_ORDER` until the table fits, and the caption names the hidden ones.
    """
    doc = routes_json if isinstance(routes_json, Mapping) else {"routes": list(routes_json)}
    routes: list[Mapping[str, Any]] = [r for r in doc.get("routes", []) if isinstance(r, Mapping)]
    ts = doc.get("timestamp")
    caption = (
        f"as of {time.strftime('%H:%M:%S', time.localtime(ts))}"
        if isinstance(ts, (int, float)) and ts > 0
        else "no evaluation yet"
    )
    every = _columns(routes)
    rows = [_row(r) for r in routes]
    hidden: list[str] = []

    def fits(without: list[str]) -> bool:
        shown = [c for c in every if c not in without]
        return width is None or _width_needed(_table(shown, rows, "", narrowest=True)) <= width

    # Drop in order until the table fits, then take back, most important first, any dropped column that
    # still fits (a narrow `k` after a wide `baseline drop` had to go).
    for column in (c for c in DROP_ORDER if c in every):
        if fits(hidden):
            break
        hidden.append(column)
    for column in reversed(list(hidden)):
        if fits([c for c in hidden if c != column]):
            hidden.remove(column)
    columns = [c for c in every if c not in hidden]
    if hidden:
        caption += f"; hidden to fit {width} columns: {', '.join(hidden)} (widen the terminal to see them)"
    return _table(columns, rows, caption)


def render_status(routes_json: Mapping[str, Any], width: int | None = None) -> RenderableType:
    """The table, then a line for each route that is down saying why in the error's own words (a `match` typo
    names the label values the endpoint does have), and one for each route whose per-position acceptance is not
    comparable (its drafts are not all k long)."""
    table = render_status_table(routes_json, width)
    why = [
        Text.assemble((f"{r.get('name', '?')}: ", "bold"), (f"down {r.get('error_reason') or '?'}: ", "red"), message)
        for r in routes_json.get("routes", [])
        if isinstance(r, Mapping) and not r.get("up") and (message := str(r.get("error_message") or ""))
    ]
    why += [
        _not_comparable(r)
        for r in routes_json.get("routes", [])
        if isinstance(r, Mapping) and r.get("up") and r.get("position_acceptance_comparable") is False
    ]
    return Group(table, *why) if why else table


def http_client(url: str, http_config_file: str) -> HttpClientConfig:
    """The client config of `--http.config.file`. Raises ConfigError, also for credentials in the URL."""
    if "@" in urlsplit(url).netloc:  # the message leaves the URL out: it holds a secret
        raise ConfigError(
            [
                "--url: credentials in the URL are refused (they end up in the shell history and `ps`); "
                "put basic_auth with a password_file in a --http.config.file"
            ]
        )
    return load_http_client_config(http_config_file) if http_config_file else DEFAULT_HTTP_CLIENT


def main(args: argparse.Namespace) -> int:
    console = Console()
    try:
        client = http_client(args.url, args.http_config_file)
    except ConfigError as exc:
        print(f"specwatch status: {exc}", file=sys.stderr)
        return 2
    session = client_session(client)
    try:
        if not args.watch:
            console.print(render_status(fetch_routes(args.url, args.timeout, session), console.width))
            return 0
        with Live(console=console, auto_refresh=False) as live:
            while True:
                try:
                    doc = fetch_routes(args.url, args.timeout, session)
                    live.update(render_status(doc, console.width), refresh=True)
                except Unreachable as exc:
                    live.update(Text(str(exc), style="bold red"), refresh=True)
                time.sleep(max(0.2, args.interval))
    except Unreachable as exc:
        console.print(f"[bold red]{exc}[/]")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        session.close()


def _flag(r: Mapping[str, Any]) -> str:
    """What the flag judges against, after batch/B*: its source (sweep, estimate, batch_size or live; an estimate's
    assumed verify kernel after a slash), "none below fit N" when the model's B* lies beyond the N sequences whose
    KV cache fits, the band
    of that source (lower-upper, "-" where a side is absent), the flag's threshold when it is not the B* shown
    (an estimate's band upper side, live calibration's B*), and the batch bins live calibration has."""
    source, threshold = r.get("crossover_flag_source"), r.get("crossover_flag_batch_size")
    bins = r.get("live_crossover_bins")
    if not source:
        return ""
    prefix = "live_crossover" if source == "live" else "crossover"
    lower, upper = r.get(f"{prefix}_lower"), r.get(f"{prefix}_upper")
    kernel = r.get("crossover_attention_kernel")
    text = f" {source}" + (f"/{kernel}" if kernel else "")  # the verify attention kernel the estimate assumes
    if lower is not None or upper is not None:
        text += f" {_number(lower, 1)}-{_number(upper, 1)}"
    if r.get("crossover_beyond_capacity"):
        text += f" none below fit {_number(r.get('crossover_kv_capacity_batch'), 0)}"
    if threshold is None:
        text += " no flag"
    elif source == "live" or threshold != r.get("crossover_batch_size"):
        text += f" flag>{_number(threshold, 1)}"
    if bins:
        text += f" ({bins} bins)"
    return text
