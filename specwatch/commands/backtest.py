"""`specwatch backtest --prometheus URL --route R --start T --end T`: replay a route's history from Prometheus.

Pulls the route's cumulative counters with `query_range` and runs exactly what `specwatch replay` runs,
printing the same JSON transitions. Two sources:

- `specwatch` (default): specwatch's own `specwatch_route_{drafts,draft_tokens,accepted_tokens}_total{route=R}`
  and the model from `specwatch_route_info`;
- `vllm`: the engine's own counters, every series matching `--selector` (one per engine), each corrected
  for restarts before they are summed, with per-position counters and `model_name` from the series.

Long ranges are fetched in chunks under Prometheus' 11,000-points-per-series limit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from typing import Iterator

import requests

from specwatch.commands.replay import load_optional_config
from specwatch.config import ConfigError, parse_duration
from specwatch.replay import TraceSample, replay
from specwatch.tracking.counters import ResetSafeCounter

MAX_POINTS_PER_QUERY = 10_000
TIMEOUT_SECONDS = 30.0

SPECWATCH_QUERIES = {
    "drafts": 'specwatch_route_drafts_total{{route="{route}"}}',
    "draft_tokens": 'specwatch_route_draft_tokens_total{{route="{route}"}}',
    "accepted_tokens": 'specwatch_route_accepted_tokens_total{{route="{route}"}}',
    "info": 'specwatch_route_info{{route="{route}"}}',
    # idle scrapes (nothing running or waiting) end the detector's blocks, as in the daemon
    "running": 'specwatch_route_running_requests{{route="{route}"}} + '
               'specwatch_route_waiting_requests{{route="{route}"}}',
}
VLLM_QUERIES = {
    "drafts": "vllm:spec_decode_num_drafts_total{{{selector}}}",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total{{{selector}}}",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total{{{selector}}}",
    "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{selector}}}",
    "running": "sum(vllm:num_requests_running{{{selector}}}) + sum(vllm:num_requests_waiting{{{selector}}})",
}


class BacktestError(Exception):
    """Prometheus could not be queried or answered nonsense; the message says which query and why."""


def _time(text: str) -> float:
    """Unix seconds, RFC 3339 (2026-11-20T00:00:00Z) or now-DURATION (now-7d)."""
    if text.startswith("now"):
        back = parse_duration(text[4:]) if text.startswith("now-") else 0.0 if text == "now" else None
        if back is None:
            raise argparse.ArgumentTypeError(f"not a time like now-7d: {text!r}")
        return dt.datetime.now(dt.timezone.utc).timestamp() - back
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a unix time, RFC 3339 time or now-DURATION: {text!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def _step(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        raise argparse.ArgumentTypeError(f"not a duration like 15s: {text!r}")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. "
                        "http://127.0.0.1:9090")
    parser.add_argument("--route", required=True, help="route name (the `route` label; also the replay route)")
    parser.add_argument("--start", required=True, type=_time, help="unix time, RFC 3339 or now-7d")
    parser.add_argument("--end", required=True, type=_time, help="unix time, RFC 3339 or now")
    parser.add_argument("--step", type=_step, default=15.0, help="query resolution (default 15s)")
    parser.add_argument("--source", choices=("specwatch", "vllm"), default="specwatch",
                        help="which counters to pull (default specwatch's own)")
    parser.add_argument("--selector", default="", help='label matchers for --source vllm, e.g. model_name="llama"')
    parser.add_argument("--config.file", dest="config_file", default=None,
                        help="config whose detection settings for the route apply")


@dataclass
class _Series:
    labels: dict[str, str]
    points: dict[float, float]


class PrometheusClient:
    def __init__(self, base_url: str, session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()

    def query_range(self, query: str, start: float, end: float, step: float) -> list[_Series]:
        """All series of `query`, fetched in chunks, points merged per series."""
        merged: dict[tuple, _Series] = {}
        chunk = step * MAX_POINTS_PER_QUERY
        t = start
        while t <= end:
            stop = min(end, t + chunk)
            for s in self._one(query, t, stop, step):
                key = tuple(sorted(s.labels.items()))
                merged.setdefault(key, _Series(s.labels, {})).points.update(s.points)
            t = stop + step
        return list(merged.values())

    def _one(self, query: str, start: float, end: float, step: float) -> list[_Series]:
        url = f"{self.base_url}/api/v1/query_range"
        try:
            params: dict[str, str | float] = {"query": query, "start": start, "end": end, "step": step}
            resp = self.session.get(url, params=params,
                                    timeout=TIMEOUT_SECONDS, headers={"Accept": "application/json"})
            body = resp.json()
        except requests.RequestException as exc:
            raise BacktestError(f"{url}: {exc}") from None
        except ValueError:
            raise BacktestError(f"{url}: HTTP {resp.status_code}, not JSON") from None
        if resp.status_code != 200 or body.get("status") != "success":
            raise BacktestError(f"{url} query {query!r}: HTTP {resp.status_code}: {body.get('error', body)}")
        out = []
        try:
            for r in body["data"]["result"]:
                out.append(_Series(dict(r["metric"]), {float(ts): float(v) for ts, v in r["values"]}))
        except (KeyError, TypeError, ValueError) as exc:
            raise BacktestError(f"{url} query {query!r}: unexpected answer ({exc!r})") from None
        return out


def _corrected_sum(series: list[_Series], timestamps: list[float]) -> dict[float, float]:
    """Sum of the series' reset-corrected totals at each timestamp; a gap holds the series' last value."""
    totals = dict.fromkeys(timestamps, 0.0)
    for s in series:
        counter = ResetSafeCounter()
        for ts in timestamps:
            value = s.points.get(ts)
            if value is not None:
                counter.update(value)
            if counter.last_value is not None:
                totals[ts] += counter.total
    return totals


def samples(client: PrometheusClient, args: argparse.Namespace) -> Iterator[TraceSample]:
    queries = SPECWATCH_QUERIES if args.source == "specwatch" else VLLM_QUERIES
    fmt = {"route": args.route, "selector": args.selector}
    fetched = {name: client.query_range(q.format(**fmt), args.start, args.end, args.step)
               for name, q in queries.items()}
    if not fetched["drafts"]:
        raise BacktestError(f"no series for {queries['drafts'].format(**fmt)} between the start and end")
    timestamps = sorted({ts for s in fetched["drafts"] for ts in s.points})
    counters = {name: _corrected_sum(fetched[name], timestamps) for name in ("drafts", "draft_tokens",
                                                                               "accepted_tokens")}
    positions = sorted({s.labels.get("position", "") for s in fetched.get("per_pos", [])},
                       key=lambda p: (len(p), p))
    per_pos = [_corrected_sum([s for s in fetched["per_pos"] if s.labels.get("position", "") == p], timestamps)
               for p in positions]
    model_series = fetched["info"] if "info" in fetched else fetched["drafts"]
    running_series = fetched.get("running", [])
    for ts in timestamps:
        model = next((s.labels.get("model_name", "") for s in model_series if ts in s.points), "")
        running = next((s.points[ts] for s in running_series if ts in s.points), None)
        yield TraceSample(ts=ts, route=args.route, model_name=model, drafts=counters["drafts"][ts],
                          draft_tokens=counters["draft_tokens"][ts],
                          accepted_tokens=counters["accepted_tokens"][ts],
                          accepted_per_pos=tuple(p[ts] for p in per_pos), running=running)


def main(args: argparse.Namespace) -> int:
    if args.end <= args.start:
        print("specwatch backtest: --end must be after --start", file=sys.stderr)
        return 2
    try:
        config = load_optional_config(args.config_file)
    except ConfigError as exc:
        print(f"specwatch backtest: {exc}", file=sys.stderr)
        return 2
    try:
        trace = list(samples(PrometheusClient(args.prometheus), args))
    except BacktestError as exc:
        print(f"specwatch backtest: {exc}", file=sys.stderr)
        return 1
    print(f"specwatch backtest: {len(trace)} samples of route {args.route}", file=sys.stderr)
    for transition in replay(trace, config):
        sys.stdout.write(transition.to_json() + "\n")
    return 0
