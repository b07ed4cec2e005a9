"""The routing advice (/api/v1/advice and its metrics), on hand-built Snapshots."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from specwatch.export.advice import ADVICE_VERSION, advice_document, route_advice
from specwatch.export.prometheus import SnapshotCollector
from specwatch.snapshot import RouteState, Snapshot

NOW = 1764403260.0


def chat(**overrides) -> RouteState:
    fields = dict(
        name="chat",
        up=True,
        engines=2,
        running_requests=18.0,
        batch_size=9.0,
        crossover_batch_size=12.0,
        crossover_source="estimate",
        above_crossover=False,
        predicted_speedup_ratio=1.2,
        last_scrape_timestamp=NOW - 5.0,
    )
    fields.update(overrides)
    return RouteState(**fields)


def test_below_the_crossover_the_advice_is_to_speculate_with_the_headroom_left():
    a = route_advice(chat())
    assert a.speculate is True
    assert a.crossover_batch_size == 12.0 and a.crossover_source == "estimate"
    assert a.headroom_per_engine == 3.0  # 12 - 9
    assert a.headroom_requests == 6.0  # 12 x 2 engines - 18 running


def test_the_flag_with_its_hysteresis_decides_not_the_raw_batch():
    # batch 11 is below B* = 12, but the flag entered above the crossover and holds until 0.9 B*
    a = route_advice(chat(batch_size=11.0, running_requests=22.0, above_crossover=True))
    assert a.speculate is False and a.headroom_per_engine == 1.0 and a.headroom_requests == 2.0


def test_above_the_crossover_the_headroom_is_negative():
    a = route_advice(chat(batch_size=20.0, running_requests=40.0, above_crossover=True))
    assert a.speculate is False and a.headroom_per_engine == -8.0 and a.headroom_requests == -16.0


def test_a_settled_live_calibration_gives_the_b_star_and_band_the_flag_judges_against():
    a = route_advice(
        chat(
            live_crossover_batch_size=10.0,
            live_crossover_lower=9.0,
            live_crossover_upper=11.5,
            live_crossover_settled=True,
        )
    )
    assert (a.crossover_batch_size, a.crossover_lower, a.crossover_upper) == (10.0, 9.0, 11.5)
    assert a.crossover_source == "live" and a.headroom_requests == 2.0
    unsettled = route_advice(chat(live_crossover_batch_size=10.0, live_crossover_settled=False))
    assert unsettled.crossover_batch_size == 12.0 and unsettled.crossover_source == "estimate"


def test_a_route_that_is_down_or_has_no_crossover_gets_no_advice():
    down = route_advice(chat(up=False, engines=None))
    assert down.speculate is None and down.headroom_requests is None and down.predicted_speedup_ratio is None
    unknown = route_advice(RouteState(name="plain", up=True, running_requests=3.0))
    assert unknown.speculate is None and unknown.crossover_batch_size is None and unknown.crossover_source == ""


def test_the_document_is_versioned_and_says_how_old_its_evidence_is():
    snapshot = Snapshot(timestamp=NOW - 2.0, routes=(chat(), chat(name="idle", up=False, last_scrape_timestamp=None)))
    doc = advice_document(snapshot, NOW)
    assert doc["version"] == ADVICE_VERSION == 1 and doc["generated"] == NOW and doc["evaluated"] == NOW - 2.0
    first, second = doc["routes"]
    assert first["route"] == "chat" and first["speculate"] is True
    assert first["crossover"] == {"batch_size": 12.0, "lower": None, "upper": None, "source": "estimate"}
    assert first["headroom"] == {"per_engine": 3.0, "requests": 6.0}
    assert first["evidence_age_seconds"] == {"evaluation": 2.0, "scrape": 5.0}
    assert second["evidence_age_seconds"] == {"evaluation": 2.0, "scrape": None}
    json.dumps(doc, allow_nan=False)


def test_before_the_first_evaluation_the_document_has_no_evaluation_age():
    doc = advice_document(Snapshot(timestamp=0.0), NOW)
    assert doc["evaluated"] is None and doc["routes"] == []


def test_the_advice_is_derivable_from_metrics_by_the_promql_the_budget_gives():
    """/metrics carries the advice's components, not the advice (docs/metrics-budget.md): speculate is
    1 - above_crossover, the per-engine headroom the flag's B* less the batch, both as the advice says."""
    registry = CollectorRegistry()
    route = chat(
        batch_size=20.0,
        running_requests=40.0,
        above_crossover=True,
        crossover_flag_source="estimate",
        crossover_flag_batch_size=12.0,
    )
    registry.register(SnapshotCollector(lambda: Snapshot(timestamp=NOW, routes=(route,))))
    value = registry.get_sample_value
    advice = route_advice(route)
    assert value("specwatch_route_speculate", {"route": "chat"}) is None
    assert value("specwatch_route_crossover_headroom_requests", {"route": "chat"}) is None
    assert 1 - value("specwatch_route_above_crossover", {"route": "chat"}) == float(advice.speculate)
    flag = value("specwatch_route_crossover_flag_batch_size", {"route": "chat", "source": "estimate"})
    assert flag - value("specwatch_route_batch_size", {"route": "chat"}) == advice.headroom_per_engine == -8.0
    assert value("specwatch_route_last_scrape_timestamp_seconds", {"route": "chat"}) == NOW - 5.0


def test_an_estimate_is_judged_on_its_bands_upper_side_like_the_flag():
    """Before live calibration settles, an estimate's flag compares the batch with its band's upper side: the
    advice's B*, headroom and band are that one's, so a gateway never sees no headroom while speculation pays."""
    r = chat(
        crossover_source="estimate",
        crossover_batch_size=24.0,
        crossover_lower=20.0,
        crossover_upper=29.0,
        crossover_flag_source="estimate",
        crossover_flag_batch_size=29.0,
        live_crossover_settled=False,
        batch_size=26.0,
        above_crossover=False,
    )
    a = route_advice(r)
    assert a.crossover_batch_size == 29.0 and a.crossover_source == "estimate"
    assert (a.crossover_lower, a.crossover_upper) == (20.0, 29.0)
    assert a.headroom_per_engine == 3.0 and a.speculate is True
