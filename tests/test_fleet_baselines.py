"""Fleet baselines: a baseline pinned in config for a (model, engine version, k) judges a fresh node's traffic from
its first cycle, and is ignored for any other key; a fleet seed that cannot be had falls back to learning
(seeding against a real Prometheus: test_fleet_seed_e2e.py)."""

from __future__ import annotations

import dataclasses
import logging
import socket
from pathlib import Path

import pytest

from specwatch.config import BasicAuth, Config, DetectionConfig, HttpClientConfig, PinnedBaseline, RouteConfig
from specwatch.config import SeedFrom, TlsConfig, parse_config
from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.evaluators.fleet_seed import SeedError, fleet_baseline, queries
from specwatch.snapshot import RouteObservation
from specwatch.state.baselines import BaselineKey

# library defaults, except the block and confirmation window used below (a busy route's shorter blocks)
DETECTION = DetectionConfig(block_seconds=60.0, confirm_window_seconds=300.0)
PIN = PinnedBaseline(acceptance_ratio=0.6, overdispersion=2.0, model="m", engine_version="0.9.1", draft_length=4)


def _evaluator(tmp_path: Path, pin: PinnedBaseline | None) -> AcceptanceDropEvaluator:
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=DETECTION), clock=lambda: 0.0)
    route = RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=DETECTION, baseline=pin)
    return build_evaluator(ctx, route)


def _busy(ts: float, ratio: float, model: str = "m", k: int = 4) -> RouteObservation:
    """One 15 s scrape of a busy route: 3000 drafted tokens in k-token drafts, accepted at `ratio`."""
    return RouteObservation(
        route="chat",
        ts=ts,
        up=True,
        model_name=model,
        engine_version="0.9.1",
        k=k,
        d_drafts=3000.0 / k,
        d_draft_tokens=3000.0,
        d_accepted=3000.0 * ratio,
        running_per_engine={"0": 8.0},
    )


def _first_page(ev: AcceptanceDropEvaluator, ratio: float, seconds: float, model: str = "m", k: int = 4) -> float:
    """Seconds until the route is degraded under traffic accepted at `ratio` from the start; inf: never."""
    for ts in range(0, int(seconds) + 1, 15):
        if ev.evaluate(_busy(float(ts), ratio, model, k), ()).get("degraded"):
            return float(ts)
    return float("inf")


def test_a_fresh_node_with_a_degraded_drafter_pages_within_one_confirmation_window(tmp_path: Path) -> None:
    """0.36 against a config baseline of 0.6 from the first scrape of an empty state dir: paged within the first
    block plus one confirmation window, and the degraded traffic never became a baseline."""
    ev = _evaluator(tmp_path, PIN)
    paged = _first_page(ev, 0.36, 3600.0)
    assert ev.reference is not None and ev.reference.source == "config" and ev.reference.acceptance_ratio == 0.6
    assert paged <= DETECTION.block_seconds + DETECTION.confirm_window_seconds, paged
    ev.close()


def test_without_the_pinned_baseline_the_fresh_node_learns_the_degraded_drafter(tmp_path: Path) -> None:
    """The case the config pin is for: a node that learns its own traffic takes the degraded drafter as normal."""
    ev = _evaluator(tmp_path, None)
    assert _first_page(ev, 0.36, 3600.0) == float("inf")
    assert ev.reference is not None and ev.reference.acceptance_ratio == pytest.approx(0.36)
    ev.close()


@pytest.mark.parametrize(
    "model, k",
    [("other-model", 4), ("m", 6)],
)
def test_a_pinned_baseline_of_another_key_is_ignored_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, model: str, k: int
) -> None:
    ev = _evaluator(tmp_path, PIN)
    with caplog.at_level(logging.WARNING, logger="specwatch.evaluators.baseline_selection"):
        assert _first_page(ev, 0.36, 3600.0, model, k) == float("inf")  # learns its own
    assert ev.reference is not None and ev.reference.source == "learned"
    said = [r for r in caplog.records if "does not apply" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    ev.close()


def test_a_pin_without_model_fields_applies_to_any_model(tmp_path: Path) -> None:
    ev = _evaluator(tmp_path, PinnedBaseline(acceptance_ratio=0.6, overdispersion=2.0))
    assert _first_page(ev, 0.36, 3600.0, "any-model", 7) <= DETECTION.block_seconds + DETECTION.confirm_window_seconds
    assert ev.reference is not None and ev.reference.source == "config"
    ev.close()


def test_a_model_change_onto_the_pinned_key_uses_it_at_once(tmp_path: Path) -> None:
    """A node learned k=6 (not pinned); the drafter moves to the pinned k=4 with a restart, degraded: the config
    baseline judges it at once rather than the k=6 one being kept until the new key earns its own."""
    ev = _evaluator(tmp_path, PIN)
    ts = 0.0
    while ev.reference is None or ts < 2400:
        ev.evaluate(_busy(ts, 0.5, k=6), ())
        ts += 15.0
    assert ev.reference.source == "learned" and ev.key is not None and ev.key.k == 6
    start, paged = ts, None
    for i in range(40):
        obs = _busy(ts, 0.36, k=4)
        if i == 0:
            obs = dataclasses.replace(obs, reset=True)
        if ev.evaluate(obs, ()).get("degraded"):
            paged = ts
            break
        ts += 15.0
    assert ev.reference.source == "config" and ev.reference.key.k == 4
    assert paged is not None and paged - start <= DETECTION.block_seconds + DETECTION.confirm_window_seconds
    ev.close()


def test_the_pinned_key_is_read_from_the_config() -> None:
    cfg = parse_config(
        {
            "routes": [
                {
                    "name": "chat",
                    "url": "http://127.0.0.1:8000/metrics",
                    "baseline": {
                        "acceptance_ratio": 0.6,
                        "overdispersion": 2.0,
                        "model": "m",
                        "engine_version": "0.9.1",
                        "draft_length": 4,
                    },
                }
            ]
        }
    )
    pin = cfg.routes[0].baseline
    assert pin is not None and (pin.model, pin.engine_version, pin.draft_length) == ("m", "0.9.1", 4)
    assert pin.applies_to("m", "0.9.1", 4) and not pin.applies_to("m", "0.9.2", 4)


@pytest.mark.slow
def test_an_unreachable_fleet_prometheus_falls_back_to_learning_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    detection = dataclasses.replace(DETECTION, seed_from=SeedFrom(prometheus=f"http://127.0.0.1:{closed}"))
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)
    ev = build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection))
    with caplog.at_level(logging.WARNING, logger="specwatch.evaluators.baseline_selection"):
        for ts in range(0, 3601, 15):
            assert not ev.evaluate(_busy(float(ts), 0.5), ()).get("degraded")
            if ev.selection.seed_attempt is not None:
                assert ev.selection.seed_attempt.wait(30.0)
    assert ev.reference is not None and ev.reference.source == "learned"
    said = [r.getMessage() for r in caplog.records if "no fleet baseline" in r.getMessage()]
    assert len(said) == 1 and "ConnectionRefusedError" in said[0], said
    assert "learning from this node's traffic" in said[0], said
    assert ev.selection.seed_errors["connection"] >= 2  # asked again every 5 minutes, said once
    ev.close()


def test_a_seed_from_file_that_cannot_be_read_is_a_seed_error_naming_it(tmp_path: Path) -> None:
    """A missing CA or secret file fails the fleet query with a reason (the route then learns and says so
    once), not an exception from inside the HTTP client."""
    key = BaselineKey("m", "0.9.1", 4)
    no_ca = SeedFrom(
        prometheus="https://127.0.0.1:1", http=HttpClientConfig(tls_config=TlsConfig(ca_file=f"{tmp_path}/ca"))
    )
    with pytest.raises(SeedError, match=f"cannot load tls_config \\({tmp_path}/ca\\)"):
        fleet_baseline("chat", key, no_ca)
    no_pw = SeedFrom(
        prometheus="http://127.0.0.1:1",
        http=HttpClientConfig(basic_auth=BasicAuth(username="u", password_file=f"{tmp_path}/pw")),
    )
    with pytest.raises(SeedError, match=f"cannot read {tmp_path}/pw"):
        fleet_baseline("chat", key, no_pw)


def test_the_fleet_query_joins_on_the_baselines_own_key_and_escapes_values() -> None:
    ratio, phi = queries("chat", BaselineKey('org/m"x', "0.9.1", 4, "eagle3:org/d"), 'job="specwatch"')
    assert ratio == (
        'specwatch_route_acceptance_baseline_ratio{route="chat",job="specwatch"} * on(job, instance, route) '
        'group_left() specwatch_route_acceptance_baseline_info{route="chat",job="specwatch",'
        'model_name="org/m\\"x",engine_version="0.9.1",draft_length="4",drafter="eagle3:org/d"}'
    )
    assert phi.startswith("specwatch_route_acceptance_baseline_overdispersion{")
