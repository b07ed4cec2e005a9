"""A route's history from Prometheus as a replay trace: the counters `specwatch backtest` replays.

Two sources:

- `specwatch`: specwatch's own `specwatch_route_{drafts,draft_tokens,accepted_tokens}_total{route=R}` and the
  model from `specwatch_route_info`;
- `vllm`: the engine's own counters, every series matching a selector (one per engine), each corrected
  for restarts before they are summed, with per-position counters and `model_name` from the series.

Long ranges are fetched in chunks under Prometheus' 11,000-points-per-series limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import requests

from specwatch.offline.replay import TraceSample
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


@dataclass
class Series:
    labels: dict[str, str]
    points: dict[float, float]


class PrometheusClient:
    def __init__(self, base_url: str, session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """All series of `query`, fetched in chunks, points merged per series."""
        merged: dict[tuple, Series] = {}
        chunk = step * MAX_POINTS_PER_QUERY
        t = start
        while t <= end:
            stop = min(end, t + chunk)
            for s in self._one(query, t, stop, step):
                key = tuple(sorted(s.labels.items()))
                merged.setdefault(key, Series(s.labels, {})).points.update(s.points)
            t = stop + step
        return list(merged.values())

    def _one(self, query: str, start: float, end: float, step: float) -> list[Series]:
        url = f"{self.base_url}/api/v1/query_range"
        try:
            params: dict[str, str | float] = {"query": query, "start": start, "end": end, "step": step}
            resp = self.session.get(url, params=params, timeout=TIMEOUT_SECONDS, headers={"Accept": "application/json"})
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
                out.append(Series(dict(r["metric"]), {float(ts): float(v) for ts, v in r["values"]}))
        except (KeyError, TypeError, ValueError) as exc:
            raise BacktestError(f"{url} query {query!r}: unexpected answer ({exc!r})") from None
        return out


def corrected_sum(series: list[Series], timestamps: list[float]) -> dict[float, float]:
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


def samples(
    client: PrometheusClient,
    route: str,
    start: float,
    end: float,
    step: float,
    source: str = "specwatch",
    selector: str = "",
) -> Iterator[TraceSample]:
    """The route's counters at each scrape between start and end, as `specwatch replay` reads them."""
    queries = SPECWATCH_QUERIES if source == "specwatch" else VLLM_QUERIES
    fmt = {"route": route, "selector": selector}
    fetched = {name: client.query_range(q.format(**fmt), start, end, step) for name, q in queries.items()}
    if not fetched["drafts"]:
        raise BacktestError(f"no series for {queries['drafts'].format(**fmt)} between the start and end")
    timestamps = sorted({ts for s in fetched["drafts"] for ts in s.points})
    counters = {
        name: corrected_sum(fetched[name], timestamps) for name in ("drafts", "draft_tokens", "accepted_tokens")
    }
    positions = sorted({s.labels.get("position", "") for s in fetched.get("per_pos", [])}, key=lambda p: (len(p), p))
    per_pos = [
        corrected_sum([s for s in fetched["per_pos"] if s.labels.get("position", "") == p], timestamps)
        for p in positions
    ]
    model_series = fetched["info"] if "info" in fetched else fetched["drafts"]
    running_series = fetched.get("running", [])
    for ts in timestamps:
        model = next((s.labels.get("model_name", "") for s in model_series if ts in s.points), "")
        running = next((s.points[ts] for s in running_series if ts in s.points), None)
        yield TraceSample(
            ts=ts,
            route=route,
            model_name=model,
            drafts=counters["drafts"][ts],
            draft_tokens=counters["draft_tokens"][ts],
            accepted_tokens=counters["accepted_tokens"][ts],
            accepted_per_pos=tuple(p[ts] for p in per_pos),
            running=running,
        )
