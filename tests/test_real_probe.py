"""Canary probes against a real vLLM (the CPU build of specwatch.testbed, tiny target and noisy drafters).

Two server starts in all (about a minute of CPU each; the restart test comes last and leaves the worse drafter): one
with the good drafter, restarted once with a drafter that accepts less. On it: both ways of reading a probe's
acceptance agree prompt by prompt (vLLM's per-request metrics and counter bracketing), bracketing keeps only prompts
that had the engine to themselves while organic requests arrive, a quiet route pages within two rounds of the
drafter swap, and 100 rounds replayed from the real engine's own per-prompt results never page.
"""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.detectors.canary import CanaryEvaluator, bracket_scraper
from specwatch.probe.prompts import BUILTIN, load_prompt_set
from specwatch.probe.runner import ProbeRunner, PromptResult, Round
from specwatch.testbed.load import run_requests
from specwatch.testbed.models import GOOD_DRAFTER_NOISE, WORSE_DRAFTER_NOISE
from specwatch.testbed.vllm_server import VllmServer, VllmServerSpec
from specwatch.tracking.baselines import BaselineStore

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
PROMPTS = 8  # of the built-in set: two of each kind (a round of 32 costs a loaded 2-core box too much)
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(engine_env, tiny_models, tmp_path_factory):
    spec = VllmServerSpec(model=tiny_models.target, per_request_spec_metrics="summary",
                          speculative={"method": "draft_model", "model": str(tiny_models.drafter(GOOD_DRAFTER_NOISE)),
                                       "num_speculative_tokens": K})
    with VllmServer(engine_env, spec, tmp_path_factory.mktemp("probe-vllm")) as srv:
        yield srv


def _config(srv: VllmServer, state_dir, every: str = "1m"):
    return parse_config({"state_dir": str(state_dir), "routes": [{
        "name": "quiet", "url": srv.metrics_url,
        "probe": {"every": every, "max_tokens": MAX_TOKENS, "timeout": "120s"}}]})


def _prompt_set():
    ps = load_prompt_set(BUILTIN)
    by_kind: dict[str, list] = {}
    for p in ps.prompts:
        by_kind.setdefault(p.kind, []).append(p)
    mixed = tuple(p for kind in sorted(by_kind) for p in by_kind[kind][:PROMPTS // 4])
    return dataclasses.replace(ps, prompts=mixed)


def _runner(srv, cfg, bracketing_only=False):
    route = cfg.routes[0]
    return ProbeRunner(route, route.probe, _prompt_set(), engine_kind=lambda: "vllm",
                       scrape=bracket_scraper(route, cfg), bracketing_only=bracketing_only)


def _counts(rnd: Round) -> dict[str, tuple[float, float, float]]:
    return {pid: (a.drafted, a.accepted, a.steps) for pid, a in rnd.read().items()}


def test_per_request_metrics_and_bracketing_agree_prompt_by_prompt(server, tmp_path):
    cfg = _config(server, tmp_path)
    per_request = _runner(server, cfg).run_now()
    again = _runner(server, cfg).run_now()
    bracketed = _runner(server, cfg, bracketing_only=True).run_now()
    assert per_request.outcome == "ok" and per_request.method == "vllm_response"
    assert bracketed.outcome == "ok" and bracketed.method == "bracketing"
    assert len(per_request.read()) == PROMPTS
    assert _counts(again) == _counts(per_request)  # greedy: a prompt's acceptance repeats
    assert _counts(bracketed) == _counts(per_request)
    assert 0 < per_request.totals().ratio < 1


def test_bracketing_keeps_only_prompts_that_had_the_engine_to_themselves(server, tmp_path):
    cfg = _config(server, tmp_path)
    reference = _counts(_runner(server, cfg).run_now())
    stop = threading.Event()

    def organic() -> None:  # a request now and then, so some prompts share the engine and some do not
        while not stop.is_set():
            run_requests(server.base_url, "tiny", 1, max_tokens=24)
            stop.wait(1.5)

    thread = threading.Thread(target=organic, daemon=True)
    thread.start()
    try:
        rnd = _runner(server, cfg, bracketing_only=True).run_now()
    finally:
        stop.set()
        thread.join(120)
    kept = _counts(rnd)
    assert all(p.error.startswith("busy") for p in rnd.prompts if p.acceptance is None)
    assert kept, "no prompt found the engine idle between organic requests"
    assert {pid: reference[pid] for pid in kept} == kept


def test_a_quiet_route_pages_within_two_rounds_of_a_worse_drafter_and_replayed_rounds_never_page(
        server, tmp_path, tiny_models):
    cfg = _config(server, tmp_path)
    daemon = Daemon(cfg, gpu_source_factory=lambda _: None)
    rounds: list[Round] = []
    try:
        canary = next(e for r in daemon._routes for e in r.evaluators if isinstance(e, CanaryEvaluator))
        clock = [10_000.0]

        def minute() -> object:
            """One minute of the daemon's life: a tick that may start a round, the round, a tick that reads it."""
            daemon.tick(clock[0])
            canary.runner.join(300)
            state = daemon.tick(clock[0] + 5).route("quiet")
            clock[0] += 60
            if canary.runner.latest is not None and (not rounds or rounds[-1] is not canary.runner.latest):
                rounds.append(canary.runner.latest)
            return state

        for _ in range(3):
            state = minute()
            assert state.probe_degraded is False and state.probe_method == "vllm_response"
        good_ratio = state.probe_acceptance_ratio
        server.restart(dataclasses.replace(server.spec, speculative={
            **server.spec.speculative, "model": str(tiny_models.drafter(WORSE_DRAFTER_NOISE))}))
        states = [minute(), minute()]  # the restart's round (on_change), then the next scheduled one
        print(f"good drafter: probe acceptance {good_ratio:.4f}; after the swap: "
              + ", ".join(f"{s.probe_acceptance_ratio:.4f} (fingerprint {s.probe_baseline_ratio:.4f}, "
                          f"degraded {s.probe_degraded})" for s in states))
        assert states[-1].probe_degraded is True, [(s.probe_acceptance_ratio, s.probe_baseline_ratio) for s in states]
        assert states[-1].probe_acceptance_ratio <= 0.85 * good_ratio
    finally:
        daemon.close()  # the module's server is left on the worse drafter: this test comes last

    # 100 rounds of the unchanged engine, replayed from the real rounds above (before the swap): each prompt's
    # result drawn from one of the real rounds, as a batch-nondeterministic engine would vary it.
    good = [r for r in rounds[:3] if r.outcome == "ok"]
    assert len(good) == 3
    rng = random.Random(17)

    class Replay:
        latest = None
        running = False

        def start(self, reason="schedule"):
            seq = (self.latest.seq if self.latest else 0) + 1
            prompts = tuple(rng.choice(good).prompts[i] for i in range(len(good[0].prompts)))
            assert all(isinstance(p, PromptResult) for p in prompts)
            self.latest = Round(seq, 0.0, 1.0, "ok", "vllm_response", "", "tiny", prompts, reason)
            return True

        def forget_method(self):
            pass

        def take_read(self):
            return []

    store = BaselineStore(str(tmp_path / "replay.db"))
    ev = CanaryEvaluator(cfg.routes[0], store, _prompt_set(), Replay())
    from specwatch.snapshot import RouteObservation
    for i in range(101):
        obs = RouteObservation(route="quiet", ts=60.0 * i, up=True, model_name="tiny", engine_version="0.32.0",
                               engine_kind="vllm", acceptance_source="counter", k=K)
        ev.evaluate(obs)
        fields = ev.evaluate(obs)
        assert fields["probe_degraded"] is False
    assert fields["probe_rounds_total"]["ok"] == 101
