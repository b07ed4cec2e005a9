"""Canary probes: prompt sets, the engines' per-request acceptance, the paired verdict, the evaluator's
schedule and decisions, probe tokens left out of tracking, and rounds against the simulator."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from pathlib import Path

import pytest
import requests

from specwatch.config import ConfigError, ProbeConfig, parse_config
from specwatch.evaluators.canary import CanaryEvaluator, bracket_scraper
from specwatch.probe import responses
from specwatch.probe.prompts import BUILTIN, PromptSetError, load_prompt_set, parse_prompt_set
from specwatch.probe.responses import Acceptance, ResponseError
from specwatch.probe.runner import _NO_ACCEPTANCE, ProbeRunner, PromptResult, Round
from specwatch.probe.verdict import compare
from specwatch.snapshot import EngineCounters, EngineSample, RouteObservation
from specwatch.state.baselines import BaselineKey
from specwatch.state.store import StateStore
from specwatch.tracking.routes import RouteTracker

FIXTURES = Path(__file__).parent / "fixtures"


# ----------------------------------------------------------------------------------------- prompt sets
def test_builtin_prompt_set_mixes_code_chat_summarisation_and_math():
    ps = load_prompt_set(BUILTIN)
    kinds = {p.kind for p in ps.prompts}
    assert kinds == {"code", "chat", "summarisation", "math"}
    assert 24 <= len(ps.prompts) <= 64
    assert len({p.id for p in ps.prompts}) == len(ps.prompts)
    assert len(ps.hash) == 12 and ps.hash == load_prompt_set(BUILTIN).hash


def test_prompt_file_replaces_the_builtin_set_and_its_hash_differs(tmp_path):
    f = tmp_path / "p.yml"
    f.write_text("prompts:\n  - {id: a, kind: code, prompt: 'def f(): pass'}\n  - {id: b, prompt: hello}\n")
    ps = load_prompt_set(str(f))
    assert [p.id for p in ps.prompts] == ["a", "b"]
    assert ps.hash != load_prompt_set(BUILTIN).hash


def test_a_broken_prompt_file_lists_every_problem():
    with pytest.raises(PromptSetError) as e:
        parse_prompt_set(
            {
                "prompts": [
                    {"id": "a", "prompt": "x"},
                    {"id": "a", "prompt": "y"},
                    {"prompt": "z"},
                    {"id": "c", "prompt": ""},
                ]
            },
            "f",
        )
    text = str(e.value)
    assert "duplicate id 'a'" in text and "prompts[2].id" in text and "prompts[3].prompt" in text


def test_a_prompt_may_be_token_ids_and_text_prompts_keep_their_hash(tmp_path):
    f = tmp_path / "ids.json"
    f.write_text(
        json.dumps(
            {"prompts": [{"id": "a", "kind": "ids", "prompt": [3, 4, 5, 6]}, {"id": "b", "prompt": "[3, 4, 5, 6]"}]}
        )
    )
    ps = load_prompt_set(str(f))
    assert ps.prompts[0].token_ids == (3, 4, 5, 6) and ps.prompts[0].payload == [3, 4, 5, 6]
    assert ps.prompts[1].payload == "[3, 4, 5, 6]"
    as_text = parse_prompt_set({"prompts": [{"id": "a", "prompt": "[3, 4, 5, 6]"}]}, "t")
    as_ids = parse_prompt_set({"prompts": [{"id": "a", "prompt": [3, 4, 5, 6]}]}, "t")
    assert as_text.hash != as_ids.hash
    assert load_prompt_set(BUILTIN).hash == "fc0295afac52"  # fingerprints stored before token ids existed still match
    with pytest.raises(PromptSetError) as e:
        parse_prompt_set(
            {
                "prompts": [
                    {"id": "a", "prompt": []},
                    {"id": "b", "prompt": [1, -2]},
                    {"id": "c", "prompt": [1, "x"]},
                    {"id": "d", "prompt": [True]},
                ]
            },
            "f",
        )
    assert all(f"prompts[{i}].prompt: a token-id prompt" in str(e.value) for i in range(4))


def test_probe_config_is_off_by_default_and_validated_whole(tmp_path):
    cfg = parse_config({"routes": [{"name": "r", "url": "http://h:8000/metrics"}]})
    assert cfg.routes[0].probe is None
    cfg = parse_config({"routes": [{"name": "r", "url": "http://h:8000/metrics", "probe": {"every": "1m"}}]})
    assert cfg.routes[0].probe == ProbeConfig(every_seconds=60.0)
    with pytest.raises(ConfigError) as e:
        parse_config(
            {
                "routes": [
                    {
                        "name": "r",
                        "url": "http://h:8000/metrics",
                        "probe": {
                            "every": "1s",
                            "api": "grpc",
                            "concurrency": 0,
                            "prompts": str(tmp_path / "missing.json"),
                            "on_change": "yes",
                            "colour": 1,
                        },
                    }
                ]
            }
        )
    problems = "\n".join(e.value.problems)
    for path in ("probe.every", "probe.api", "probe.concurrency", "probe.prompts", "probe.on_change", "probe.colour"):
        assert f"routes[0].{path}" in problems


def test_example_config_shows_probes_and_passes_the_check():
    from specwatch.config import load_config

    cfg = load_config(Path(__file__).parent.parent / "examples" / "specwatch.yml")
    assert any(r.probe is not None for r in cfg.routes)


# ----------------------------------------------------------------------------------------- engine answers
def _fixture(path: str) -> dict:
    return json.loads((FIXTURES / path).read_text())


def test_vllm_per_request_metrics_are_read_from_its_completion_answer():
    a = responses.vllm_completion(_fixture("vllm/responses/probe_completion_0.32.0.json"))
    assert (a.drafted, a.accepted, a.steps) == (90, 55, 30)
    assert a.histogram == (5, 6, 8, 11)
    assert a.per_position() == (25.0, 19.0, 11.0)  # steps that accepted position j: Σ histogram[j+1:]
    assert a.mean_length == pytest.approx(1 + 55 / 30)


def test_sglang_generate_meta_info_is_read():
    a = responses.sglang_generate(_fixture("sglang/responses/probe_generate_0.5.23.json"))
    assert (a.drafted, a.accepted, a.steps) == (150, 85, 50)
    assert a.ratio == pytest.approx(85 / 150)


def test_sglang_openai_sglext_is_read():
    a = responses.sglang_openai(_fixture("sglang/responses/probe_openai_sglext_0.5.23.json"))
    assert (a.drafted, a.accepted, a.steps) == (150, 85, 50)


def test_answers_without_spec_fields_say_none_and_malformed_ones_raise():
    assert responses.vllm_completion({"choices": [], "usage": {}}) is None
    assert responses.vllm_completion({"metrics": {"time_to_first_token_ms": 3.0}}) is None
    assert responses.sglang_generate({"meta_info": {"id": "x", "completion_tokens": 1}}) is None
    assert responses.sglang_openai({"choices": []}) is None
    with pytest.raises(ResponseError, match="num_draft_tokens"):
        responses.vllm_completion({"metrics": {"speculative_decoding": {"num_draft_tokens": "x"}}})
    with pytest.raises(ResponseError, match="meta_info"):
        responses.sglang_generate({"text": "x"})
    with pytest.raises(ResponseError, match="> spec_num_proposed_drafts"):
        responses.sglang_generate(
            {"meta_info": {"spec_verify_ct": 1, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 3}}
        )


# ----------------------------------------------------------------------------------------- paired verdict
def _prompts(ratios: list[float], drafted: float = 100.0) -> dict[str, Acceptance]:
    return {f"p{i}": Acceptance(drafted, r * drafted, drafted / 3) for i, r in enumerate(ratios)}


def test_a_uniform_drop_of_drop_is_low_and_an_unchanged_round_is_clean():
    rng = random.Random(1)
    base = [rng.uniform(0.4, 0.8) for _ in range(32)]
    same = compare(_prompts([r + rng.gauss(0, 0.005) for r in base]), _prompts(base), 0.15)
    assert not same.low and same.clean and abs(same.drop) < 0.02
    dropped = compare(_prompts([r * 0.8 for r in base]), _prompts(base), 0.15)
    assert dropped.low and dropped.drop == pytest.approx(0.2) and dropped.z < -3


def test_one_odd_prompt_does_not_make_a_round_low():
    base = [0.6] * 10
    one = [0.6] * 9 + [0.0]  # a 10% pooled drop carried by one prompt
    c = compare(_prompts(one), _prompts(base), 0.12)
    assert c.drop == pytest.approx(0.1) and not c.low


def test_too_few_paired_prompts_give_no_verdict():
    assert compare(_prompts([0.5, 0.5, 0.5]), _prompts([0.7, 0.7, 0.7]), 0.15) is None


# ----------------------------------------------------------------------------------------- the evaluator
class ScriptedRunner:
    """Stands in for ProbeRunner: each start() finishes a round at once with the next scripted per-prompt
    ratios (or an outcome string)."""

    def __init__(self, script):
        self.script = iter(script)
        self.latest = None
        self.seq = 0
        self.starts: list[str] = []
        self.running = False

    def start(self, reason="schedule"):
        self.starts.append(reason)
        self.seq += 1
        item = next(self.script)
        if isinstance(item, str):
            self.latest = Round(self.seq, 0.0, 1.0, item, "bracketing", item, reason=reason)
        else:
            prompts = tuple(PromptResult(pid, "chat", a) for pid, a in _prompts(item).items())
            self.latest = Round(self.seq, 0.0, 1.0, "ok", "vllm_response", "", "m", prompts, reason)
        return True

    def forget_method(self):
        pass

    def take_read(self):
        return []


def _evaluator(tmp_path, script, drop=0.15, every="1m", store=None):
    cfg = parse_config(
        {
            "state_dir": str(tmp_path),
            "routes": [{"name": "r", "url": "http://h:8000/metrics", "drop": drop, "probe": {"every": every}}],
        }
    )
    store = store or StateStore(str(tmp_path / "b.db"))
    ev = CanaryEvaluator(cfg.routes[0], store, load_prompt_set(BUILTIN), ScriptedRunner(script))
    return ev, store


def _obs(ts, model="m", version="0.32.0", k=3, reset=False, waiting=0.0, up=True):
    return RouteObservation(
        route="r",
        ts=ts,
        up=up,
        model_name=model,
        engine_version=version,
        engine_kind="vllm",
        acceptance_source="counter",
        k=k,
        reset=reset,
        waiting_requests=waiting,
    )


BASE = [0.3 + 0.5 * i / 31 for i in range(32)]


def _run(ev, observations):
    """Evaluate each observation twice (once to start the round, once to read it), as ticks would."""
    fields = None
    for obs in observations:
        ev.evaluate(obs)
        fields = ev.evaluate(dataclasses.replace(obs, reset=False))  # a reset is seen once
    return fields


def test_first_round_becomes_the_fingerprint_and_a_20pct_drafter_drop_pages_within_two_rounds(tmp_path):
    lower = [r * 0.8 for r in BASE]
    ev, store = _evaluator(tmp_path, [BASE, BASE, lower, lower, BASE])
    f = _run(ev, [_obs(0), _obs(60)])
    assert f["probe_degraded"] is False and f["probe_baseline_ratio"] == pytest.approx(f["probe_acceptance_ratio"])
    assert store.fingerprint("r", BaselineKey("m", "0.32.0", 3), load_prompt_set(BUILTIN).hash)
    f = _run(ev, [_obs(120, reset=True)])  # restart with the worse drafter: on_change runs a round at once
    assert ev.runner.starts[-1] == "change" and f["probe_degraded"] is False
    f = _run(ev, [_obs(180)])
    assert f["probe_degraded"] is True and f["probe_acceptance_ratio"] == pytest.approx(0.8 * f["probe_baseline_ratio"])
    f = _run(ev, [_obs(240)])  # back to the fingerprint: resolved
    assert f["probe_degraded"] is False


def test_a_hundred_rounds_of_an_unchanged_engine_never_page(tmp_path):
    rng = random.Random(7)
    # GPU batch non-determinism moves a greedy prompt's acceptance a little from round to round
    script = [[min(1.0, r + rng.gauss(0, 0.02)) for r in BASE] for _ in range(101)]
    ev, _ = _evaluator(tmp_path, script)
    for i in range(101):
        f = _run(ev, [_obs(60.0 * i)])
        assert f["probe_degraded"] is False
    assert f["probe_rounds_total"]["ok"] == 101


def test_a_new_model_is_judged_against_the_previous_fingerprint_then_adopts_its_own(tmp_path):
    better = [min(1.0, r * 1.05) for r in BASE]
    ev, store = _evaluator(tmp_path, [BASE, better, better, better])
    _run(ev, [_obs(0)])
    f = _run(ev, [_obs(60, model="m2")])
    assert f["probe_baseline_ratio"] == pytest.approx(sum(BASE) / len(BASE))  # still the old model's
    assert not store.fingerprint("r", BaselineKey("m2", "0.32.0", 3), ev.prompt_hash)
    f = _run(ev, [_obs(120, model="m2")])
    assert store.fingerprint("r", BaselineKey("m2", "0.32.0", 3), ev.prompt_hash)  # adopted after 2 rounds
    assert ev.reference_key == BaselineKey("m2", "0.32.0", 3)
    f = _run(ev, [_obs(180, model="m2")])
    assert f["probe_baseline_ratio"] == pytest.approx(sum(better) / len(better)) and f["probe_degraded"] is False


def test_a_new_model_that_accepts_less_pages_and_is_not_adopted(tmp_path):
    worse = [r * 0.75 for r in BASE]
    ev, store = _evaluator(tmp_path, [BASE, worse, worse, worse])
    _run(ev, [_obs(0)])
    f = _run(ev, [_obs(60, model="m2"), _obs(120, model="m2")])
    assert f["probe_degraded"] is True
    f = _run(ev, [_obs(180, model="m2")])
    assert f["probe_degraded"] is True
    assert not store.fingerprint("r", BaselineKey("m2", "0.32.0", 3), ev.prompt_hash)


def test_verdict_and_reference_survive_a_restart_of_specwatch(tmp_path):
    lower = [r * 0.8 for r in BASE]
    ev, store = _evaluator(tmp_path, [BASE, lower, lower])
    _run(ev, [_obs(0), _obs(60), _obs(120)])
    assert ev.degraded
    ev2, _ = _evaluator(tmp_path, [lower], store=store)
    f = _run(ev2, [_obs(180)])
    assert f["probe_degraded"] is True and ev2.reference_key == BaselineKey("m", "0.32.0", 3)


def test_rounds_wait_for_their_schedule_skip_a_saturated_engine_and_back_off_on_errors(tmp_path):
    ev, _ = _evaluator(tmp_path, [BASE, "error", "error", BASE, BASE], every="10m")
    _run(ev, [_obs(0)])
    _run(ev, [_obs(60), _obs(300)])
    assert len(ev.runner.starts) == 1  # not due before 10 minutes
    f = _run(ev, [_obs(600, waiting=3)])
    assert len(ev.runner.starts) == 1 and f["probe_rounds_total"]["skipped"] == 1
    _run(ev, [_obs(660)])  # after the first backoff (30 s x 2)
    assert len(ev.runner.starts) == 2 and ev.last.outcome == "error"
    _run(ev, [_obs(700)])
    assert len(ev.runner.starts) == 2  # the next backoff is longer
    f = _run(ev, [_obs(800)])
    assert len(ev.runner.starts) == 3 and f["probe_success"] is False and f["probe_rounds_total"]["error"] == 2


def test_no_round_starts_while_the_route_is_down(tmp_path):
    ev, _ = _evaluator(tmp_path, [BASE])
    ev.evaluate(_obs(0, up=False))
    assert ev.runner.starts == []


# ----------------------------------------------------------------------------------------- tracking
def _vllm_sample(ts, drafts, draft_tokens, accepted, per_pos):
    return EngineSample(
        ts=ts,
        engine_kind="vllm",
        acceptance_source="counter",
        model_name="m",
        num_speculative_tokens=len(per_pos),
        engines=(
            EngineCounters(
                "0", drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted, accepted_per_pos=per_pos
            ),
        ),
    )


def test_probe_tokens_are_left_out_of_windows_and_deltas_but_not_out_of_the_engine_totals():
    t = RouteTracker("r")
    t.observe(_vllm_sample(0, 0, 0, 0, (0, 0, 0)))
    # organic: 100 drafts, 300 tokens, 240 accepted; probe: 30 drafts, 90 tokens, 30 accepted
    t.exclude(30, 90, 30, (20, 8, 2))
    obs = t.observe(_vllm_sample(5, 130, 390, 270, (110, 100, 60)))
    assert (obs.d_drafts, obs.d_draft_tokens, obs.d_accepted) == (100, 300, 240)
    assert obs.d_accepted_per_pos == (90, 92, 58)
    assert obs.window_acceptance["1m"] == pytest.approx(0.8)
    assert t.state().draft_tokens_total == 390


def test_an_exclusion_larger_than_the_interval_is_carried_over():
    t = RouteTracker("r")
    t.observe(_vllm_sample(0, 0, 0, 0, (0,)))
    t.exclude(10, 10, 5, (5,))
    obs = t.observe(_vllm_sample(5, 4, 4, 2, (2,)))
    assert (obs.d_draft_tokens, obs.d_accepted) == (0, 0)
    obs = t.observe(_vllm_sample(10, 20, 20, 10, (10,)))
    assert (obs.d_draft_tokens, obs.d_accepted) == (10, 5)


# ----------------------------------------------------------------------------------------- against the simulator
def _runner(sim, kind, api="auto", prompts=None):
    cfg = parse_config(
        {"routes": [{"name": "r", "url": sim.url + "/metrics", "probe": {"every": "1m", "max_tokens": 24, "api": api}}]}
    )
    route = cfg.routes[0]
    ps = load_prompt_set(BUILTIN)
    if prompts:
        ps = type(ps)(ps.name, ps.prompts[:prompts])
    return ProbeRunner(route, route.probe, ps, engine_kind=lambda: kind, scrape=bracket_scraper(route, cfg))


@pytest.mark.slow
def test_vllm_rounds_read_per_request_metrics_and_repeat_prompt_by_prompt(simulator):
    sim = simulator()
    runner = _runner(sim, "vllm")
    first, second = runner.run_now(), runner.run_now()
    assert first.outcome == "ok" and first.method == "vllm_response" and len(first.read()) == 32
    assert first.read() == second.read()  # greedy: the same prompt accepts the same way
    taken = runner.take_read()
    assert len(taken) == 64 and sum(a.drafted for a in taken) == 2 * first.totals().drafted


@pytest.mark.slow
@pytest.mark.parametrize("api, method", [("auto", "sglang_generate"), ("openai", "sglang_openai")])
def test_sglang_rounds_read_generate_meta_info_or_sglext(simulator, api, method):
    sim = simulator("sglang")
    rnd = _runner(sim, "sglang", api=api, prompts=8).run_now()
    assert rnd.outcome == "ok" and rnd.method == method and len(rnd.read()) == 8


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, api, method, field",
    [
        ("vllm", "auto", "vllm_response", "prompt"),
        ("sglang", "auto", "sglang_generate", "input_ids"),
        ("sglang", "openai", "sglang_openai", "prompt"),
    ],
)
def test_token_id_prompts_are_sent_as_ids(simulator, kind, api, method, field):
    sim = simulator(kind)
    sent: list[dict] = []

    class Recording(requests.Session):
        def post(self, url, json=None, **kw):  # type: ignore[override]
            sent.append(json)
            return super().post(url, json=json, **kw)

    cfg = parse_config(
        {"routes": [{"name": "r", "url": sim.url + "/metrics", "probe": {"every": "1m", "max_tokens": 24, "api": api}}]}
    )
    route = cfg.routes[0]
    ps = parse_prompt_set(
        {"prompts": [{"id": f"p{i}", "prompt": [10 * i + j for j in range(4)]} for i in range(4)]}, "ids"
    )
    runner = ProbeRunner(route, route.probe, ps, engine_kind=lambda: kind, session_factory=Recording)
    first, again = runner.run_now(), runner.run_now()
    assert first.outcome == "ok" and first.method == method and len(first.read()) == 4
    assert first.read() == again.read()
    assert sorted(body[field] for body in sent[:4]) == [[10 * i + j for j in range(4)] for i in range(4)]
    assert all("text" not in body for body in sent)


@pytest.mark.slow
def test_bracketing_reads_the_same_acceptance_as_the_per_request_metrics(simulator):
    per_request = _runner(simulator(), "vllm", prompts=6).run_now()
    bracketed = _runner(simulator(per_request="none"), "vllm", prompts=6).run_now()
    assert bracketed.outcome == "ok" and bracketed.method == "bracketing"
    assert {p: (a.drafted, a.accepted, a.steps) for p, a in bracketed.read().items()} == {
        p: (a.drafted, a.accepted, a.steps) for p, a in per_request.read().items()
    }


@pytest.mark.slow
def test_bracketing_discards_prompts_that_shared_the_engine_with_organic_requests(simulator):
    reference = _runner(simulator(), "vllm", prompts=12).run_now().read()
    sim = simulator(per_request="none")
    stop = threading.Event()

    def organic():
        while not stop.is_set():
            requests.post(sim.url + "/v1/completions", json={"prompt": "organic", "max_tokens": 40}, timeout=10)
            stop.wait(0.05)

    thread = threading.Thread(target=organic, daemon=True)
    thread.start()
    try:
        rnd = _runner(sim, "vllm", prompts=12).run_now()
    finally:
        stop.set()
        thread.join(10)
    kept = rnd.read()
    discarded = [p for p in rnd.prompts if p.acceptance is None]
    assert all(p.error.startswith("busy") for p in discarded)
    for pid, a in kept.items():  # whatever was kept is the prompt's own acceptance, nothing else's
        assert (a.drafted, a.accepted) == (reference[pid].drafted, reference[pid].accepted)


@pytest.mark.slow
def test_rounds_never_overlap_and_run_off_the_calling_thread(simulator):
    sim = simulator()
    runner = _runner(sim, "vllm", prompts=4)
    assert runner.start()
    assert not runner.start() or not runner.running  # a second start while one runs is refused
    runner.join(30)
    assert runner.latest is not None and runner.latest.outcome == "ok"


@pytest.mark.slow
def test_a_dead_engine_makes_an_error_round_not_an_exception(simulator):
    sim = simulator()
    runner = _runner(sim, "vllm", prompts=4)
    sim.stop()
    rnd = runner.run_now()
    assert rnd.outcome == "error" and rnd.message


@pytest.mark.slow
def test_daemon_pages_a_drafter_bump_on_a_quiet_route_within_two_rounds(simulator, tmp_path):
    from specwatch.daemon import Daemon

    sim = simulator()
    cfg = parse_config(
        {
            "state_dir": str(tmp_path),
            "routes": [{"name": "r", "url": sim.url + "/metrics", "probe": {"every": "1m", "max_tokens": 24}}],
        }
    )
    daemon = Daemon(cfg, gpu_source_factory=lambda _: None)
    try:
        canary = next(e for r in daemon._routes for e in r.evaluators if isinstance(e, CanaryEvaluator))

        def tick(now):
            daemon.tick(now)
            canary.runner.join(60)  # a round runs on its own thread; let it finish before the next tick
            return daemon.tick(now + 1).route("r")

        state = tick(1000.0)
        assert state.probe_degraded is False and state.probe_method == "vllm_response"
        state = tick(1060.0)
        assert state.probe_degraded is False
        # organic windows saw none of the probes' tokens
        assert state.acceptance_ratio.get("1m") is None
        sim.simulation._set_profile(sim.simulation.profile.scaled(0.8))  # a drafter that accepts less
        sim.simulation._restart()
        states = [tick(1120.0), tick(1180.0)]
        assert states[-1].probe_degraded is True
        assert states[-1].probe_acceptance_ratio < 0.9 * states[-1].probe_baseline_ratio
    finally:
        daemon.close()


class _BlockingSession:
    """A requests.Session stand-in whose POSTs wait until released (a round that is still running)."""

    def __init__(self, release: threading.Event):
        self.release = release

    def post(self, *args, **kwargs):
        self.release.wait(30)
        raise requests.ConnectionError("released")

    def get(self, *args, **kwargs):
        raise requests.ConnectionError("no models endpoint")

    def close(self):
        pass


def test_a_reloaded_runner_waits_for_the_round_its_predecessor_still_runs():
    cfg = parse_config({"routes": [{"name": "r", "url": "http://127.0.0.1:9/metrics", "probe": {}}]})
    route, ps = cfg.routes[0], load_prompt_set(BUILTIN)
    release = threading.Event()
    old = ProbeRunner(
        route, route.probe, ps, engine_kind=lambda: "vllm", session_factory=lambda: _BlockingSession(release)
    )
    assert old.start()
    new = ProbeRunner(
        route,
        route.probe,
        ps,
        engine_kind=lambda: "vllm",
        previous=old,
        session_factory=lambda: _BlockingSession(release),
    )
    assert new.running and not new.start()
    release.set()
    old.join(30)
    assert not new.running and old.latest.outcome == "error"


@pytest.mark.slow
def test_probe_command_prints_a_per_prompt_table_and_adopts_a_fingerprint(simulator, tmp_path, capsys):
    from specwatch.cli import main

    sim = simulator()
    config = tmp_path / "specwatch.yml"
    config.write_text(
        f"state_dir: {tmp_path}\ninterval: 30s\nscrape: {{timeout: 20s}}\n"  # a loaded box can be slow to answer
        f"routes:\n  - name: chat\n    url: {sim.url}/metrics\n    probe: {{max_tokens: 16}}\n"
    )
    assert main(["probe", "chat", "--config.file", str(config)]) == 0
    out = capsys.readouterr().out
    assert "code-fizzbuzz" in out and "math-primes" in out and "no fingerprint yet" in out
    assert main(["probe", "chat", "--config.file", str(config), "--adopt"]) == 0
    assert "adopted as the fingerprint" in capsys.readouterr().out
    assert main(["probe", "chat", "--config.file", str(config)]) == 0
    out = capsys.readouterr().out
    assert "drop +0.0% over 32 prompts" in out and "-> clean" in out
    assert main(["probe", "nope", "--config.file", str(config)]) == 2
    assert "no route 'nope'" in capsys.readouterr().err


def test_only_one_route_per_engine_may_probe_it():
    with pytest.raises(ConfigError, match=r"routes\[1\].probe: routes\[0\] already probes http://h:8000"):
        parse_config(
            {
                "routes": [
                    {"name": "a", "url": "http://h:8000/metrics", "match": {"model_name": "x"}, "probe": {}},
                    {"name": "b", "url": "http://h:8000/metrics", "match": {"model_name": "y"}, "probe": {}},
                ]
            }
        )


def test_a_bracket_waits_for_a_repeated_reading_so_a_late_finish_count_cannot_hide_an_organic_request():
    """An engine may answer a prompt before counting it finished. If an organic request finished meanwhile, the
    first quiet reading shows one finish (the organic one) and both requests' tokens: the next poll's second
    finish must turn the prompt into a busy one, not a reading of both requests as the prompt's."""
    cfg = parse_config({"routes": [{"name": "r", "url": "http://127.0.0.1:9/metrics", "probe": {"every": "1m"}}]})
    route = cfg.routes[0]
    readings = iter(
        [
            (_vllm_sample(0, 100, 300, 200, (0,)), 10.0),  # before: idle
            (_vllm_sample(1, 124, 372, 238, (0,)), 11.0),  # organic finish counted, the prompt's not yet
            (_vllm_sample(2, 124, 372, 238, (0,)), 12.0),  # now the prompt's too
            (_vllm_sample(3, 124, 372, 238, (0,)), 12.0),
        ]
    )
    runner = ProbeRunner(
        route,
        route.probe,
        load_prompt_set(BUILTIN),
        engine_kind=lambda: "vllm",
        scrape=lambda: next(readings),
        sleep=lambda seconds: None,
    )
    prompt = runner.prompt_set.prompts[0]
    runner._send = lambda *args: PromptResult(prompt.id, prompt.kind, error=_NO_ACCEPTANCE)
    result = runner._bracket_one(None, "openai", "completion", "", prompt)
    assert result.acceptance is None and result.error.startswith("busy: 2 requests finished")


def test_an_operator_adopt_makes_the_next_round_the_fingerprint_at_once(tmp_path):
    """`POST /api/v1/baselines/r/adopt` queues "adopt": the canary runs a round now and takes it as the
    fingerprint, so a deliberately weaker drafter does not page (without the adopt it would, within two rounds)."""
    lower = [r * 0.8 for r in BASE]
    ev, store = _evaluator(tmp_path, [BASE, lower, lower, lower], every="1h")
    _run(ev, [_obs(0)])
    store.append_command("r", "adopt")
    store.tick(30.0)  # the daemon's command poll
    f = _run(ev, [_obs(30)])
    assert ev.runner.starts[-1] == "change"  # at once, not at the next due time an hour away
    key = BaselineKey("m", "0.32.0", 3)
    assert f["probe_baseline_ratio"] == pytest.approx(sum(lower) / len(lower))
    assert store.fingerprint("r", key, ev.prompt_hash)
    f = _run(ev, [_obs(3630), _obs(7230)])
    assert f["probe_degraded"] is False
