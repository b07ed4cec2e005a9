"""`specwatch fleet accept --model NAME ...`: accept a deliberate model bump on every node of a fleet at once.

1. Targets (`targets_from_file`, `targets_from_prometheus`): `--targets FILE`, one host:port a line (`#`
   comments), or `--prometheus URL`: Prometheus's own active targets (`/api/v1/targets`) whose labels match
   `--selector`, healthy or not (a node that Prometheus cannot scrape is one the operator must hear about).
2. Routes: `--route R ...`, else every route of each node (its /api/v1/routes).
3. `accept_node`: first `GET /api/v1/baselines`, whose `accept_fields` say that the daemon takes an accept
   naming its model (a daemon that predates it took any accept as the old one, which could delete: such a node
   is refused here, untouched); then one `POST /api/v1/baselines/{route}/accept` per route, naming the model
   (and optionally the engine version and draft length) the route must run; each daemon decides on its live
   state and adopts only where the route runs that key and has evidence for it, refusing elsewhere with the
   reason and changing nothing (commands/_admin.py). Nodes are asked concurrently, at most PARALLEL at a time.
4. `render`: a table of node, route, outcome and the baseline before -> after (or the reason), then the summary
   line; exit 0 only when no node refused or was unreachable, 1 otherwise, 2 on a usage error.

Idempotent: a node that adopted answers "already" the next time, so the command is rerun until it exits 0.
"""

from __future__ import annotations

import argparse
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote, urlsplit

import requests
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specwatch.config import BasicAuth, HttpClientConfig, TlsConfig
from specwatch.sources.http import client_session

PARALLEL = 16  # nodes asked at once
DEFAULT_SELECTOR = 'job="specwatch"'
UNREACHABLE = "unreachable"
OUTCOME_STYLE = {"adopted": "green", "already": "cyan", "would_adopt": "yellow", "refused": "red", UNREACHABLE: "red"}
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class UsageError(Exception):
    """Bad flags, an unreadable targets file, or a Prometheus that does not list targets (exit 2)."""


@dataclass(frozen=True)
class Row:
    node: str
    route: str
    outcome: str  # adopted, already, would_adopt, refused, unreachable
    detail: str = ""
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser(
        "accept",
        help="adopt the new model's baseline on every node that runs it and has evidence for it",
        description="Adopt the new key's baseline on every node and route that runs --model (and --engine-version, "
        "--draft-length, --drafter if given) and has evidence for it; every other node refuses and keeps its baseline.",
    )
    p.add_argument("--model", required=True, help="the model the routes must run (its name as the engine reports it)")
    p.add_argument("--engine-version", dest="engine_version", default=None, help="the engine version they must run")
    p.add_argument("--draft-length", dest="draft_length", type=int, default=None, help="the draft length k")
    p.add_argument(
        "--drafter",
        default=None,
        help='the speculative method and drafter they must run, as the baseline info shows it ("method:drafter")',
    )
    p.add_argument(
        "--route", dest="routes", action="extend", nargs="+", default=None, help="route(s) to accept on (default: all)"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--targets", metavar="FILE", help="file of host:port, one a line (# comments)")
    source.add_argument("--prometheus", metavar="URL", help="take the targets from this Prometheus's target list")
    p.add_argument(
        "--selector",
        default=DEFAULT_SELECTOR,
        help=f'label matchers (name="value", comma separated) the Prometheus targets must have '
        f"(default {DEFAULT_SELECTOR})",
    )
    p.add_argument("--dry-run", dest="dry_run", action="store_true", help="say what each node would do; change nothing")
    p.add_argument(
        "--scheme", choices=("http", "https"), default=None, help="default: the target's scrape scheme, else http"
    )
    p.add_argument("--ca-file", dest="ca_file", default="", help="CA to verify the nodes (and Prometheus) with")
    p.add_argument("--cert-file", dest="cert_file", default="", help="client certificate, with --key-file")
    p.add_argument("--key-file", dest="key_file", default="", help="the client certificate's key")
    p.add_argument("--user", default=None, help="basic-auth user of the nodes' admin API")
    p.add_argument("--password-file", dest="password_file", default=None, help="file holding --user's password")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")


def main(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
        if args.targets:
            nodes = [(args.scheme or "http", n) for n in targets_from_file(args.targets)]
        else:
            nodes = targets_from_prometheus(args.prometheus, args.selector, args.timeout, args.ca_file, args.scheme)
    except UsageError as exc:
        print(f"specwatch fleet: {exc}", file=sys.stderr)
        return 2
    if not nodes:
        print("specwatch fleet: no targets", file=sys.stderr)
        return 2
    body: dict[str, Any] = {"model": args.model}
    if args.engine_version is not None:
        body["engine_version"] = args.engine_version
    if args.draft_length is not None:
        body["draft_length"] = args.draft_length
    if args.drafter is not None:
        body["drafter"] = args.drafter
    if args.dry_run:
        body["dry_run"] = True

    def one(node: tuple[str, str]) -> list[Row]:
        return accept_node(node[0], node[1], args.routes, body, client, args.timeout)

    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(nodes))) as pool:
        rows = [row for rows in pool.map(one, nodes) for row in rows]
    console = Console()
    if not console.is_terminal:  # piped or logged: one line per row, never wrapped at 80 columns
        console = Console(width=max(400, console.width))
    console.print(render(rows))
    line, ok = summary(rows, args.dry_run)
    print(line)
    return 0 if ok else 1


# --------------------------------------------------------------------------------------------- targets
def targets_from_file(path: str) -> list[str]:
    """host:port per line, in order and without repeats; blank lines and `#` comments skipped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read --targets {path}: {exc.strerror or exc}") from exc
    nodes: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if "/" in entry or " " in entry or not _has_port(entry):
            raise UsageError(f"{path}:{number}: {entry!r} is not host:port")
        if entry not in nodes:
            nodes.append(entry)
    return nodes


def _has_port(entry: str) -> bool:
    host, sep, port = entry.rpartition(":")
    return bool(sep and host and port.isdigit())


def parse_selector(selector: str) -> dict[str, str]:
    """`name="value", ...` as a dict; UsageError for anything else (only equality matchers are taken)."""
    text = selector.strip().strip("{}")
    matchers: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise UsageError(f'--selector {selector!r}: expected name="value" matchers, comma separated')
        matchers[m.group(1)] = re.sub(r"\\(.)", r"\1", m.group(2))
        pos = m.end()
    if not matchers:
        raise UsageError(f"--selector {selector!r} matches nothing in particular; name the job")
    return matchers


def targets_from_prometheus(
    url: str, selector: str, timeout: float, ca_file: str = "", scheme: str | None = None
) -> list[tuple[str, str]]:
    """(scheme, host:port) of Prometheus's active targets whose labels match `selector`, whatever their health."""
    matchers = parse_selector(selector)
    session = client_session(HttpClientConfig(tls_config=TlsConfig(ca_file=ca_file)))
    api = url.rstrip("/") + "/api/v1/targets"
    try:
        response = session.get(api, params={"state": "active"}, timeout=timeout)
        response.raise_for_status()
        targets = response.json()["data"]["activeTargets"]
    except requests.RequestException as exc:
        raise UsageError(f"cannot list Prometheus's targets at {api}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{api}: not a Prometheus targets answer ({exc!r})") from exc
    finally:
        session.close()
    nodes: list[tuple[str, str]] = []
    for target in targets:
        labels = target.get("labels") or {}
        if any(labels.get(name) != value for name, value in matchers.items()):
            continue
        scrape = urlsplit(str(target.get("scrapeUrl", "")))
        address = scrape.netloc.rpartition("@")[2] or str((target.get("discoveredLabels") or {}).get("__address__"))
        node = (scheme or scrape.scheme or "http", address)
        if address and node not in nodes:
            nodes.append(node)
    if not nodes:
        raise UsageError(f"Prometheus at {url} has no active target matching {selector}")
    return nodes


# --------------------------------------------------------------------------------------------- the requests
def _client(args: argparse.Namespace) -> HttpClientConfig:
    if bool(args.cert_file) != bool(args.key_file):
        raise UsageError("--cert-file and --key-file go together")
    if (args.user is None) != (args.password_file is None):
        raise UsageError("--user and --password-file go together")
    if args.password_file is not None and not Path(args.password_file).is_file():
        raise UsageError(f"--password-file {args.password_file}: no such file")
    auth = BasicAuth(username=args.user, password_file=args.password_file) if args.user is not None else None
    tls = TlsConfig(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)
    return HttpClientConfig(basic_auth=auth, tls_config=tls)


def accept_node(
    scheme: str,
    node: str,
    routes: Sequence[str] | None,
    body: dict[str, Any],
    client: HttpClientConfig,
    timeout: float,
) -> list[Row]:
    """One node's answers, a row per route (one row for the node when it cannot be reached)."""
    base = f"{scheme}://{node}"
    session = client_session(client)
    try:
        try:
            _check_api(session, base, timeout)
            if routes is None:
                routes = _node_routes(session, base, timeout)
        except _NodeError as exc:
            return [Row(node, "-", exc.outcome, str(exc))]
        rows = []
        for route in routes:
            url = f"{base}/api/v1/baselines/{quote(route, safe='')}/accept"
            try:
                response = session.post(url, json=body, timeout=timeout, headers={"Content-Type": "application/json"})
            except requests.RequestException as exc:
                rows.append(Row(node, route, UNREACHABLE, _why(exc)))
                continue
            rows.append(_row(node, route, response))
        return rows
    finally:
        session.close()


class _NodeError(Exception):
    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def _check_api(session: requests.Session, base: str, timeout: float) -> None:
    """The node's daemon takes an accept that names its model; _NodeError otherwise."""
    doc = _get_json(session, base + "/api/v1/baselines", timeout, "its baselines API")
    if not isinstance(doc, dict) or "model" not in (doc.get("accept_fields") or ()):
        raise _NodeError(
            "refused",
            "its specwatch predates the accept that names a model (it would take this one as the old accept, "
            "which could delete a baseline): not asked; upgrade it first",
        )


def _get_json(session: requests.Session, url: str, timeout: float, what: str) -> Any:
    try:
        response = session.get(url, timeout=timeout, headers={"Accept": "application/json"})
    except requests.RequestException as exc:
        raise _NodeError(UNREACHABLE, _why(exc)) from exc
    if response.status_code != 200:
        raise _NodeError("refused", f"{what}: HTTP {response.status_code} {response.text.strip()[:200]}")
    try:
        return response.json()
    except ValueError as exc:
        raise _NodeError("refused", f"{what}: not JSON; is this a specwatch daemon?") from exc


def _node_routes(session: requests.Session, base: str, timeout: float) -> list[str]:
    doc = _get_json(session, base + "/api/v1/routes", timeout, "listing its routes")
    try:
        return [str(r["name"]) for r in doc["routes"]]
    except (KeyError, TypeError) as exc:
        raise _NodeError("refused", f"listing its routes: not a specwatch answer ({exc!r})") from exc


def _why(exc: requests.RequestException) -> str:
    """The operator's reason, not urllib3's chain: "connection refused", "timed out", ..."""
    if isinstance(exc, requests.Timeout):
        return "timed out"
    errno = _ERRNO.search(str(exc))
    if errno:
        return errno.group(1).strip().lower()
    return f"{type(exc).__name__}: {exc}"[:200]


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def _row(node: str, route: str, response: requests.Response) -> Row:
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Row(node, route, "refused", f"HTTP {response.status_code}: {response.text.strip()[:200]}")
    outcome = doc.get("outcome")
    if response.status_code in (200, 409) and outcome in ("adopted", "already", "would_adopt", "refused"):
        detail = str(doc.get("reason") or doc.get("message") or "").removeprefix(f"route {route}: ")
        return Row(node, route, str(outcome), detail, doc.get("before"), doc.get("after"))
    return Row(node, route, "refused", f"HTTP {response.status_code}: {doc.get('error') or doc}")


# --------------------------------------------------------------------------------------------- output
def _baseline(doc: dict[str, Any] | None) -> str:
    if not doc:
        return "-"
    try:
        ratio = f"{float(doc['acceptance_ratio']):.4f}"
    except (KeyError, TypeError, ValueError):
        ratio = "?"
    k, drafter = doc.get("draft_length"), doc.get("drafter")
    text = f"{ratio} {doc.get('model') or '-'} {doc.get('engine_version') or '-'} k={k or '?'}"
    return f"{text} {drafter}" if drafter else text


def render(rows: Sequence[Row]) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for column in ("NODE", "ROUTE", "OUTCOME", "BEFORE", "AFTER", "DETAIL"):
        table.add_column(column, overflow="fold")
    for r in rows:
        changed = r.outcome in ("adopted", "would_adopt")
        # Text, not markup: an IPv6 node ("[::1]:9400") or a reason must print as it is
        table.add_row(
            Text(r.node),
            Text(r.route),
            Text(r.outcome, style=OUTCOME_STYLE.get(r.outcome, "red")),
            Text(_baseline(r.before)),
            Text(_baseline(r.after) if changed else ""),
            Text(r.detail if not changed else ""),
        )
    return table


def summary(rows: Sequence[Row], dry_run: bool = False) -> tuple[str, bool]:
    """The summary line and whether every node accepted (none refused, none unreachable). Routes are counted
    by outcome; unreachable counts nodes."""

    def count(outcome: str) -> int:
        return sum(1 for r in rows if r.outcome == outcome)

    unreachable = len({r.node for r in rows if r.outcome == UNREACHABLE})
    refused = count("refused")
    line = f"adopted {count('adopted')}, already {count('already')}, refused {refused}, unreachable {unreachable}"
    if dry_run:
        line += f", would adopt {count('would_adopt')} (dry run: nothing changed)"
    return line, refused == 0 and unreachable == 0
