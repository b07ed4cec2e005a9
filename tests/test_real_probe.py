"""Canary probes against a real vLLM (the CPU build of testbed) serving the successor models.

The successor target and drafters (testbed/successor.py) make every probe's acceptance known in
advance: greedy verification accepts a draft token iff it is the successor of the last one, so
`successor.simulate` predicts each token-id prompt's drafted, accepted and verify steps exactly. The probe set is
those token-id prompts, in a prompt file, sent as `prompt: [ids]`.

On the shared successor server (tests/real_vllm_servers.py; the swap test runs after every test on the base
drafter): the base drafter (`SUCCESSOR_BASE`), restarted once on the same port with `SUCCESSOR_DROP_20`,
which accepts exactly 0.80x as much over `successor.prompts(795, 32)` x 32 tokens (the design set). On it:
vLLM's per-request metrics and counter bracketing both read exactly the predicted counts, prompt by prompt;
bracketing keeps only prompts that had the engine to themselves while organic requests arrive; a daemon with
`probe: {every: 1m}` (its clock stepped a minute per round, the rounds back to back) runs 100 live rounds of a
cheap set on the unchanged engine without paging, and a daemon probing with the design set pages within two
rounds of the restart with the DROP_20 drafter (and so does the first, its set seeing 0.82x).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests

from engine_counters import engine_values, spec_counts
from real_vllm_servers import K, successor_spec
from specwatch.config import Config, parse_config
from specwatch.daemon import Daemon
from specwatch.evaluators.canary import CanaryEvaluator, bracket_scraper
from specwatch.probe.prompts import load_prompt_set
from specwatch.probe.runner import ProbeRunner, Round
from specwatch.snapshot import RouteState
from testbed import successor
from testbed.load import run_requests
from testbed.models import SUCCESSOR_BASE, SUCCESSOR_DROP_20
from testbed.vllm_server import VllmServer

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

VOCAB = 795
# The swap's set: over these, the DROP_20 drafter accepts exactly 0.80x what the base one does (models.py).
DESIGN_PROMPTS, DESIGN_TOKENS = successor.prompts(VOCAB, 32), 32
# A cheap round, for the method tests and the 100 unchanged rounds: the DROP_20 drafter accepts 0.82x the base
# over it, evenly enough across its prompts that it pages too.
SMALL_PROMPTS, SMALL_TOKENS = successor.prompts(VOCAB, 7), 16
UNCHANGED_ROUNDS = 100

Counts = tuple[float, float, float]  # drafted, accepted, verify steps


@pytest.fixture
def server(successor_vllm, tiny_models) -> VllmServer:
    """The shared successor server on the base drafter."""
    return successor_vllm.serve(successor_spec(tiny_models, SUCCESSOR_BASE))


def _prompt_id(prompt: list[int]) -> str:
    return f"from-{prompt[0]}"


def _prompt_file(directory: Path, prompts: list[list[int]]) -> str:
    path = directory / "successor-prompts.json"
    path.write_text(json.dumps({"prompts": [{"id": _prompt_id(p), "kind": "successor", "prompt": p} for p in prompts]}))
    return str(path)


def _predicted(fraction: float, prompts: list[list[int]], max_tokens: int) -> dict[str, Counts]:
    """Each prompt's (drafted, accepted, verify steps) under the drafter of this wrong fraction, by design."""
    wrong = successor.wrong_tokens(VOCAB, fraction)
    out = {}
    for p in prompts:
        c = successor.simulate(p[-1], VOCAB, K, wrong, max_tokens)
        out[_prompt_id(p)] = (float(c.draft_tokens), float(c.accepted), float(c.drafts))
    return out


def _ratio(counts: dict[str, Counts]) -> float:
    return sum(a for _, a, _ in counts.values()) / sum(d for d, _, _ in counts.values())


def _config(
    srv: VllmServer,
    directory: Path,
    prompts: list[list[int]],
    max_tokens: int,
    route: str = "quiet",
    concurrency: int = 1,
) -> Config:
    directory.mkdir(parents=True, exist_ok=True)
    return parse_config(
        {
            "state_dir": str(directory / "state"),
            "routes": [
                {
                    "name": route,
                    "url": srv.metrics_url,
                    "probe": {
                        "every": "1m",
                        "prompts": _prompt_file(directory, prompts),
                        "max_tokens": max_tokens,
                        "concurrency": concurrency,
                        "timeout": "120s",
                    },
                }
            ],
        }
    )


def _runner(cfg: Config, bracketing_only: bool = False) -> ProbeRunner:
    route = cfg.routes[0]
    assert route.probe is not None
    return ProbeRunner(
        route,
        route.probe,
        load_prompt_set(route.probe.prompts),
        engine_kind=lambda: "vllm",
        scrape=bracket_scraper(route, cfg),
        bracketing_only=bracketing_only,
    )


def _counts(rnd: Round) -> dict[str, Counts]:
    return {pid: (a.drafted, a.accepted, a.steps) for pid, a in rnd.read().items()}


@pytest.mark.successor_vllm("base")
def test_per_request_metrics_and_bracketing_read_the_designed_acceptance_prompt_by_prompt(server, tmp_path):
    cfg = _config(server, tmp_path, SMALL_PROMPTS, SMALL_TOKENS)
    per_request = _runner(cfg).run_now()
    bracketed = _runner(cfg, bracketing_only=True).run_now()
    assert per_request.outcome == "ok" and per_request.method == "vllm_response", per_request.message
    assert bracketed.outcome == "ok" and bracketed.method == "bracketing", bracketed.message
    expected = _predicted(SUCCESSOR_BASE, SMALL_PROMPTS, SMALL_TOKENS)
    assert _counts(per_request) == expected
    assert _counts(bracketed) == expected


@pytest.mark.successor_vllm("base")
def test_bracketing_keeps_only_prompts_that_had_the_engine_to_themselves(server, tmp_path):
    """Organic requests arrive during every other prompt of a bracketed round: those prompts are discarded as
    busy, and the others read exactly their own designed counts."""
    cfg = _config(server, tmp_path, SMALL_PROMPTS, SMALL_TOKENS)
    expected = _predicted(SUCCESSOR_BASE, SMALL_PROMPTS, SMALL_TOKENS)
    shared = {_prompt_id(p) for p in SMALL_PROMPTS[1::2]}
    organic_prompt = [5, 6, 7, 8, 9]
    organic: list[bool] = []

    class OrganicDuringSomePrompts(requests.Session):
        def post(self, url, json=None, **kw):  # type: ignore[override]
            prompt = (json or {}).get("prompt")
            if not isinstance(prompt, list) or _prompt_id(prompt) not in shared:
                return super().post(url, json=json, **kw)
            thread = threading.Thread(
                target=lambda: organic.extend(
                    r.ok for r in run_requests(server.base_url, "tiny", 1, max_tokens=64, prompts=[organic_prompt])
                )
            )
            thread.start()
            while engine_values(server.get("/metrics"))["running"] < 1 and thread.is_alive():
                time.sleep(0.02)  # the organic request is in the engine before the prompt is
            try:
                return super().post(url, json=json, **kw)
            finally:
                thread.join(120)  # it finishes inside the prompt's bracket

    route = cfg.routes[0]
    assert route.probe is not None
    runner = ProbeRunner(
        route,
        route.probe,
        load_prompt_set(route.probe.prompts),
        engine_kind=lambda: "vllm",
        scrape=bracket_scraper(route, cfg),
        bracketing_only=True,
        session_factory=OrganicDuringSomePrompts,
    )
    before = spec_counts(server.get("/metrics"))
    rnd = runner.run_now()
    after = spec_counts(server.get("/metrics"))
    busy = {p.prompt_id: p.error for p in rnd.prompts if p.acceptance is None}
    assert organic == [True] * len(shared)
    assert set(busy) == shared and all(e.startswith("busy") for e in busy.values()), busy
    assert rnd.outcome == "ok" and _counts(rnd) == {pid: c for pid, c in expected.items() if pid not in shared}
    # The engine drafted for the organic requests and the shared prompts too: bracketing left all of that out.
    assert after.draft_tokens - before.draft_tokens > sum(d for d, _, _ in _counts(rnd).values())


class _Minutes:
    """A daemon probing the route, its clock stepped a minute per call and the round run to completion in between:
    the one-minute schedule without the wait, through the daemon's own tick."""

    def __init__(self, cfg: Config) -> None:
        self.daemon = Daemon(cfg, gpu_source_factory=lambda _: None)
        self.route = cfg.routes[0].name
        self.canary = next(e for r in self.daemon._routes for e in r.evaluators if isinstance(e, CanaryEvaluator))
        self.clock = 10_000.0

    def minute(self) -> tuple[RouteState, Round]:
        """A tick that starts the round that is due, the round, a tick that judges it."""
        self.daemon.tick(self.clock)
        self.canary.runner.join(300)
        state = self.daemon.tick(self.clock + 5).route(self.route)
        self.clock += 60
        rnd = self.canary.runner.latest
        assert state is not None and rnd is not None
        return state, rnd


@pytest.mark.successor_vllm("swap")
def test_100_live_rounds_never_page_and_a_20_percent_worse_drafter_pages_within_two_rounds(
    server, successor_vllm, tmp_path, tiny_models
):
    small_base = _predicted(SUCCESSOR_BASE, SMALL_PROMPTS, SMALL_TOKENS)
    base = _predicted(SUCCESSOR_BASE, DESIGN_PROMPTS, DESIGN_TOKENS)
    worse = _predicted(SUCCESSOR_DROP_20, DESIGN_PROMPTS, DESIGN_TOKENS)
    assert _ratio(worse) / _ratio(base) == pytest.approx(0.80, abs=0.001)
    # Two daemons, one route each, on the one engine (never probing at once): the 100 unchanged rounds on the
    # cheap set, the swap on the design set.
    unchanged = _Minutes(
        _config(server, tmp_path / "small", SMALL_PROMPTS, SMALL_TOKENS, "unchanged", concurrency=len(SMALL_PROMPTS))
    )
    swap = _Minutes(_config(server, tmp_path / "design", DESIGN_PROMPTS, DESIGN_TOKENS, "swap", concurrency=8))
    try:
        state, rnd = unchanged.minute()  # a route's first round becomes its fingerprint
        assert rnd.outcome == "ok" and rnd.method == "vllm_response" and _counts(rnd) == small_base, rnd
        began = time.monotonic()
        for i in range(UNCHANGED_ROUNDS):
            state, rnd = unchanged.minute()
            assert rnd.seq == i + 2 and rnd.outcome == "ok" and _counts(rnd) == small_base, rnd
            assert state.probe_degraded is False
        unchanged_seconds = time.monotonic() - began
        assert state.probe_rounds_total["ok"] == UNCHANGED_ROUNDS + 1

        state, rnd = swap.minute()
        assert rnd.outcome == "ok" and _counts(rnd) == base and state.probe_degraded is False, rnd
        assert successor_vllm.serve(successor_spec(tiny_models, SUCCESSOR_DROP_20)) is server  # same port, restarted
        # The restart's round (on_change), then the next scheduled one, on each route.
        after = [(swap.minute(), unchanged.minute()) for _ in range(2)]
    finally:
        unchanged.daemon.close()
        swap.daemon.close()  # the shared server is left on the DROP_20 drafter, for the gate's test on it
    print(
        f"\n{UNCHANGED_ROUNDS} unchanged rounds of {len(SMALL_PROMPTS)} prompts x {SMALL_TOKENS} tokens in "
        f"{unchanged_seconds:.1f}s; design set fingerprint {_ratio(base):.4f}, after the swap: "
        + ", ".join(f"{s.probe_acceptance_ratio:.4f} ({r.reason}, degraded {s.probe_degraded})" for (s, r), _ in after)
    )
    (_, first), (swapped, second) = (pair[0] for pair in after)
    assert (first.reason, second.reason) == ("change", "schedule")
    assert _counts(first) == worse and _counts(second) == worse
    assert swapped.probe_degraded is True
    assert swapped.probe_acceptance_ratio == pytest.approx(_ratio(worse))
    assert swapped.probe_baseline_ratio == pytest.approx(_ratio(base))
    # The set of the 100 unchanged rounds pages on this drafter too (0.82x over it): their silence was no blind spot.
    assert after[-1][1][0].probe_degraded is True
