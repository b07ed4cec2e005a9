"""specwatch against a real llama.cpp `llama-server` (b11434, built here by testbed/llamacpp_build.py): what it
reports equals the engine's own counters, through a restart after a short first life, a drafter swap and an
idle route afterwards; canary probes read each answer's own `timings`.

The engine serves tiny GGUF models written by testbed/llamacpp_models.py (a random Llama and drafters made
from it with known noise) to greedy requests, so every run drafts and accepts the same tokens. The build takes
about 15-30 minutes on a 2-core machine the first time and is cached outside the clone afterwards.
"""

from __future__ import annotations

import json
import shutil
import sys
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.cli import main as cli_main
from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.evaluators.canary import bracket_scraper
from specwatch.export.prometheus import render_text
from specwatch.probe.prompts import load_prompt_set
from specwatch.probe.runner import ProbeRunner
from specwatch.state.store import StateStore
from testbed import llamacpp_build, llamacpp_models
from testbed.llamacpp_server import PROMPTS, LlamaServer, LlamaServerSpec, Load, drive, measure_baseline

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 4
N_PREDICT = 32


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    flags = _cpu_flags()
    if not flags & {"avx2", "avx512f"}:
        pytest.skip("llama.cpp's CPU build needs AVX2 or AVX-512 for these tests to run in reasonable time")
    if llamacpp_build.is_current():
        return llamacpp_build.binary_path()
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"llama-server is not built and cannot be: {', '.join(missing)} not found")
    print(
        f"\nllama-server is not built yet: building it, or waiting for the build under way "
        f"(scripts/test.sh logs its background build to {llamacpp_build.log_path()})",
        file=sys.__stderr__,
        flush=True,
    )
    return llamacpp_build.build()


@pytest.fixture(scope="session")
def gguf(llama_binary, tmp_path_factory) -> dict[str, Path]:
    return llamacpp_models.write_all(tmp_path_factory.mktemp("gguf"))


def engine_counts(body: str) -> dict:
    """The engine's own figures, parsed by prometheus_client (not specwatch's parser)."""
    out: dict = {"per_pos": {}}
    names = {
        "llamacpp:spec_decode_num_drafts": "drafts",
        "llamacpp:spec_decode_num_draft_tokens": "draft_tokens",
        "llamacpp:spec_decode_num_accepted_tokens": "accepted",
        "llamacpp:requests_processing": "running",
        "llamacpp:requests_deferred": "waiting",
    }
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            if base in names:
                out[names[base]] = sample.value
            elif base == "llamacpp:spec_decode_num_accepted_tokens_per_pos":
                out["per_pos"][int(sample.labels["position"])] = sample.value
    out["per_pos"] = [out["per_pos"][j] for j in sorted(out["per_pos"])]
    return out


def _config(tmp_path: Path, url: str, engine: str = "llamacpp", **route: object) -> object:
    return parse_config(
        {
            "interval": "15s",
            "state_dir": str(tmp_path / "state"),
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": "10s"},
            "routes": [{"name": "r", "url": url, "engine": engine, **route}],
        }
    )


def _state(daemon: Daemon, up: bool = True):
    (state,) = daemon.tick().routes
    if up:
        assert state.up, state.error_reason
    return state


@pytest.fixture
def server(llama_binary, gguf, tmp_path):
    spec = LlamaServerSpec(model=gguf["target"], drafter=gguf["small"], draft_max=K)
    with LlamaServer(llama_binary, spec, tmp_path / "engine") as srv:
        yield srv


def test_every_figure_equals_the_engines_own_counters_and_auto_detection_finds_it(server, tmp_path):
    fresh = server.get("/metrics")
    assert "llamacpp:spec_decode_num_drafts_total 0" in fresh
    assert "per_pos" not in fresh, "the per-position series appears only after the first request finishes"
    daemon = Daemon(_config(tmp_path, server.metrics_url, engine="auto"))
    try:
        first = _state(daemon)
        assert (first.engine_kind, first.acceptance_source) == ("llamacpp", "counter"), "an all-zero sample counts"
        before = engine_counts(server.get("/metrics"))
        drive(server, 6, N_PREDICT)
        state = _state(daemon)
        after = engine_counts(server.get("/metrics"))
    finally:
        daemon.close()
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted"] - before["accepted"]
    print(f"\nllama.cpp counted {drafts:.0f} drafts, {draft_tokens:.0f} draft tokens, {accepted:.0f} accepted")
    assert drafts > 0 and 0 < accepted < draft_tokens
    assert (state.drafts_total, state.draft_tokens_total, state.accepted_tokens_total) == (
        after["drafts"],
        after["draft_tokens"],
        after["accepted"],
    )
    for window in ("1m", "5m", "1h"):
        assert state.acceptance_ratio[window] == pytest.approx(accepted / draft_tokens, rel=1e-12)
        assert state.mean_acceptance_length[window] == pytest.approx(1 + accepted / drafts, rel=1e-12)
    assert len(after["per_pos"]) == K
    assert state.position_acceptance_ratio == pytest.approx([p / drafts for p in after["per_pos"]], rel=1e-12)
    assert sum(after["per_pos"]) == accepted
    assert state.draft_length == pytest.approx(draft_tokens / drafts, rel=1e-12)
    assert (state.running_requests, state.waiting_requests) == (after["running"], after["waiting"])
    props = json.loads(server.get("/props"))
    assert state.model_name == props["model_alias"] == "tiny"
    assert state.engine_version == props["build_info"] and state.engine_version.startswith("b11434")


def test_draft_max_is_removed_and_a_drafter_alone_never_speculates(llama_binary, gguf, tmp_path):
    removed = subprocess.run(
        [str(llama_binary), "-m", str(gguf["target"]), "--draft-max", "4"], capture_output=True, text=True, timeout=120
    )
    assert removed.returncode != 0 and "--spec-draft-n-max" in removed.stdout + removed.stderr
    spec = LlamaServerSpec(model=gguf["target"], extra_args=("--spec-draft-model", str(gguf["copy"])))
    with LlamaServer(llama_binary, spec, tmp_path / "engine") as srv:
        answers = drive(srv, 2, 16)
        counts = engine_counts(srv.get("/metrics"))
    assert counts["drafts"] == 0 and all("draft_n" not in a["timings"] for a in answers)


def test_a_restart_after_a_short_first_life_is_a_restart(server, tmp_path):
    drive(server, 1, N_PREDICT)
    old = engine_counts(server.get("/metrics"))
    daemon = Daemon(_config(tmp_path, server.metrics_url))
    try:
        _state(daemon)  # the old server's counts are history: adopted, not windowed
        server.restart()
        zero = _state(daemon)  # the new server, all zero: a sample, and a restart
        assert zero.model_changes_total == 1 and zero.drafts_total == old["drafts"]
        drive(server, 2, N_PREDICT)
        state = _state(daemon)
        new = engine_counts(server.get("/metrics"))
    finally:
        daemon.close()
    assert (state.drafts_total, state.draft_tokens_total, state.accepted_tokens_total) == (
        old["drafts"] + new["drafts"],
        old["draft_tokens"] + new["draft_tokens"],
        old["accepted"] + new["accepted"],
    )
    for window in ("1m", "5m", "1h"):
        assert state.acceptance_ratio[window] == pytest.approx(new["accepted"] / new["draft_tokens"], rel=1e-12)
    assert state.position_acceptance_ratio == pytest.approx([p / new["drafts"] for p in new["per_pos"]], rel=1e-12)
    assert state.model_changes_total == 1


def test_a_restart_whose_counters_come_back_higher_is_seen_through_the_refused_connection(server, tmp_path):
    daemon = Daemon(_config(tmp_path, server.metrics_url))
    try:
        _state(daemon)
        drive(server, 1, N_PREDICT)
        old = engine_counts(server.get("/metrics"))
        _state(daemon)
        server.stop()
        assert not _state(daemon, up=False).up  # connection refused: the engine is gone
        server.start()
        drive(server, 3, N_PREDICT)  # the new life outgrows the old before the next scrape
        new = engine_counts(server.get("/metrics"))
        assert new["drafts"] > old["drafts"] and new["accepted"] > old["accepted"]
        state = _state(daemon)
    finally:
        daemon.close()
    assert state.model_changes_total == 1
    assert state.drafts_total == old["drafts"] + new["drafts"]
    assert state.acceptance_ratio["1h"] == pytest.approx(
        (old["accepted"] + new["accepted"]) / (old["draft_tokens"] + new["draft_tokens"]), rel=1e-12
    )


def _route_series(text: bytes) -> dict[str, set[str]]:
    """Exported route series by metric name -> their window labels ('' where none)."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name.startswith("specwatch_route_") and sample.labels.get("route") == "r":
                out.setdefault(sample.name, set()).add(sample.labels.get("window", ""))
    return out


def test_an_idle_route_after_a_restart_shows_consistent_series(server, tmp_path):
    daemon = Daemon(_config(tmp_path, server.metrics_url))
    try:
        _state(daemon)
        drive(server, 2, N_PREDICT)
        _state(daemon)
        before = _route_series(render_text(daemon.tick()))
        server.restart()
        snapshots = [daemon.tick() for _ in range(2)]  # idle: no request reaches the new server
    finally:
        daemon.close()
    (state,) = snapshots[-1].routes
    assert state.up and state.model_changes_total == 1
    after = _route_series(render_text(snapshots[-1]))
    detail = (
        "specwatch_route_acceptance_ratio",
        "specwatch_route_position_acceptance_ratio",
        "specwatch_route_draft_length",
    )
    totals = (
        "specwatch_route_drafts_total",
        "specwatch_route_draft_tokens_total",
        "specwatch_route_accepted_tokens_total",
    )
    for name in totals:
        assert name in before and name in after, f"{name} vanished after the restart"
    # The windows still hold the old server's drafting: every windowed series is there, or none is.
    present = [name in after for name in detail]
    assert all(present) or not any(present), {name: name in after for name in detail}
    assert after.get("specwatch_route_acceptance_ratio") == before.get("specwatch_route_acceptance_ratio")


def test_a_drafter_swap_pages_through_the_drop_detector(server, gguf, tmp_path):
    rate, phi = measure_baseline(server, 12, N_PREDICT)
    config = parse_config(
        {
            "interval": "1s",
            "state_dir": str(tmp_path / "state"),
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": "0.9s"},
            "detection": {"min_drafted_tokens": 300, "min_duration": "5s", "confirm_window": "10s", "block": "15s"},
            "routes": [
                {
                    "name": "r",
                    "url": server.metrics_url,
                    "engine": "llamacpp",
                    "baseline": {"acceptance_ratio": round(rate, 6), "overdispersion": round(phi, 4)},
                }
            ],
        }
    )
    daemon = Daemon(config)
    flagged_after = None
    try:
        with Load(server, N_PREDICT):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                assert not _state(daemon).degraded, "the drafter the baseline was measured on was flagged"
                time.sleep(1.0)
            server.restart(server.spec.with_drafter(gguf["large"]))
            swapped = time.monotonic()
            while time.monotonic() - swapped < 300:
                state = _state(daemon, up=False)
                if state.up and state.degraded:
                    flagged_after = time.monotonic() - swapped
                    break
                time.sleep(1.0)
        new = engine_counts(server.get("/metrics"))  # the new server's own counts, since the swap
    finally:
        daemon.close()
    new_rate = new["accepted"] / new["draft_tokens"]
    print(
        f"\ndrafter swap: baseline {rate:.3f} (phi {phi:.2f}); the new drafter's own {new_rate:.3f}; flagged "
        f"after {flagged_after}s; drop {state.drop_ratio}"
    )
    assert new_rate < 0.8 * rate, "the swapped-in drafter was meant to accept much less"
    assert flagged_after is not None, f"the swap to a noisier drafter was not flagged: {state.acceptance_ratio}"
    assert state.model_changes_total >= 1


def _settle(daemon: Daemon, server: LlamaServer, drafter: str) -> object:
    """Drive drafting requests, tick until the route is up with a draft length and `drafter`, then three more
    ticks (a change would show in them); the last RouteState."""
    drive(server, 6, N_PREDICT)
    deadline = time.monotonic() + 120
    state = _state(daemon, up=False)
    while not (state.up and state.draft_length is not None and state.drafter == drafter):
        assert time.monotonic() < deadline, f"the route never showed drafter {drafter!r}: {state}"
        time.sleep(1.0)
        state = _state(daemon, up=False)
    for _ in range(3):
        time.sleep(1.0)
        state = _state(daemon)
    return state


def _up(daemon: Daemon) -> object:
    deadline = time.monotonic() + 120
    state = _state(daemon, up=False)
    while not state.up:
        assert time.monotonic() < deadline, f"the route never came back: {state.error_reason}"
        time.sleep(1.0)
        state = _state(daemon, up=False)
    return state


def test_a_method_swap_at_the_same_model_and_k_is_a_key_change_and_a_same_method_restart_is_not(server, gguf, tmp_path):
    """llama-server b11434 tells its speculative method on /slots (not the draft file: nothing it answers names
    that), so the swap here is draft-simple -> ngram-simple, both drafting up to K tokens, under the same alias.
    A restart already counts one model change; the key change counts one more, once the new server says what
    it runs (after its first request), and moves the baseline key."""
    ngram = LlamaServerSpec(
        model=gguf["target"],
        extra_args=(
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "2",
            "--spec-ngram-simple-size-m",
            str(K),
        ),
    )
    daemon = Daemon(_config(tmp_path, server.metrics_url))
    try:
        _state(daemon)
        first = _settle(daemon, server, "draft-simple")
        server.restart(server.spec)  # the same method again
        same_restart = _up(daemon)
        same = _settle(daemon, server, "draft-simple")
        server.restart(ngram)
        swap_restart = _up(daemon)
        swapped = _settle(daemon, server, "ngram-simple")
        positions = len(engine_counts(server.get("/metrics"))["per_pos"])
    finally:
        daemon.close()
    stored = StateStore.in_state_dir(str(tmp_path / "state"), readonly=True, repair=False).route_state("r")
    assert stored is not None
    print(f"\nllama.cpp key: {first.drafter} -> {same.drafter} -> {swapped.drafter}; stored key {stored['key']}")
    assert (first.model_name, first.drafter) == ("tiny", "draft-simple")
    assert positions == K, "the new method drafts up to K tokens too: the same k"
    assert same.drafter == "draft-simple" and same.model_changes_total == same_restart.model_changes_total
    assert swap_restart.drafter == "draft-simple", "not told yet: the last told drafter holds"
    assert (swapped.model_name, swapped.drafter) == ("tiny", "ngram-simple")
    assert swapped.model_changes_total == swap_restart.model_changes_total + 1
    assert swapped.last_model_change_timestamp > swap_restart.last_model_change_timestamp
    assert stored["key"][0] == "tiny" and stored["key"][3] == "ngram-simple"


def test_a_canary_probe_reads_each_answers_own_timings(server, tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(
        json.dumps({"prompts": [{"id": f"p{j}", "kind": "text", "prompt": p} for j, p in enumerate(PROMPTS)]})
    )
    cfg = _config(
        tmp_path,
        server.metrics_url,
        probe={"every": "1m", "prompts": str(prompts), "max_tokens": N_PREDICT, "concurrency": 1, "timeout": "60s"},
    )
    route = cfg.routes[0]
    assert route.probe is not None
    runner = ProbeRunner(
        route,
        route.probe,
        load_prompt_set(route.probe.prompts),
        engine_kind=lambda: "llamacpp",
        scrape=bracket_scraper(route, cfg),
    )
    before = engine_counts(server.get("/metrics"))
    rnd = runner.run_now()
    after = engine_counts(server.get("/metrics"))
    assert rnd.outcome == "ok" and rnd.method == "llamacpp_timings", rnd.message
    read = rnd.read()
    assert len(read) == len(PROMPTS)
    # The prompts ran one at a time: their answers' counts add up to what the engine's counters moved by.
    assert sum(a.drafted for a in read.values()) == after["draft_tokens"] - before["draft_tokens"]
    assert sum(a.accepted for a in read.values()) == after["accepted"] - before["accepted"]


def test_the_crossover_batch_is_the_mean_busy_slots_per_decode_of_the_cycle(server, tmp_path):
    """b11434's n_busy_slots_per_decode is a since-start ratio beside n_decode_total: their product's increase
    over n_decode's is the mean busy slots per llama_decode() of the cycle. One request at a time keeps exactly
    one slot busy in every decode, while requests_processing reads 0 once the requests are done."""
    from specwatch.sources.engines import parse_engine_sample
    from specwatch.tracking.routes import RouteTracker

    route = _config(tmp_path, server.metrics_url).routes[0]

    def totals(body: str) -> tuple[float, float]:
        values = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
        decodes = values["llamacpp:n_decode_total"]
        return decodes, values["llamacpp:n_busy_slots_per_decode"] * decodes

    tracker = RouteTracker("r")
    drive(server, 1, N_PREDICT)
    first = server.get("/metrics")
    tracker.observe(parse_engine_sample("llamacpp", first, route, 0.0))
    drive(server, 4, N_PREDICT)
    last = server.get("/metrics")
    obs = tracker.observe(parse_engine_sample("llamacpp", last, route, 15.0))
    (d0, s0), (d1, s1) = totals(first), totals(last)
    print(f"\nllama.cpp: {d1 - d0:.0f} decodes, {s1 - s0:.1f} busy slot-decodes over the cycle")
    assert d1 > d0
    assert obs.running_per_engine["0"] == pytest.approx((s1 - s0) / (d1 - d0), rel=1e-9)
    assert obs.running_per_engine["0"] == pytest.approx(1.0, abs=0.01)
    assert tracker.state().running_requests == 0.0


def test_the_gate_passes_the_same_drafter_and_fails_a_noisier_one(server, gguf, tmp_path):
    """`specwatch gate` on llama-server with the built-in probe set: the drafter the reference was recorded on
    passes in each of five runs, the noisier drafter fails in each of five, 2 tokens a prompt is inconclusive."""
    reference = tmp_path / "reference.json"
    common = ["--url", server.base_url, "--engine", "llamacpp", "--max-tokens", str(N_PREDICT), "--timeout", "60"]
    assert cli_main(["gate", "record", *common, "--out", str(reference)]) == 0

    def gate(*extra: str) -> tuple[int, dict]:
        out = tmp_path / f"gate-{len(list(tmp_path.glob('gate-*.json')))}.json"
        rc = cli_main(["gate", *common, "--reference", str(reference), "--json", str(out), *extra])
        return rc, json.loads(out.read_text())

    same = [gate() for _ in range(5)]
    assert [rc for rc, _ in same] == [0] * 5, [doc["reason"] for _, doc in same]
    assert all(doc["method"] == "llamacpp_timings" for _, doc in same)
    short_rc, short = gate("--max-tokens", "2")
    assert short_rc == 2 and short["verdict"] == "inconclusive", short["reason"]

    server.restart(server.spec.with_drafter(gguf["large"]))
    worse = [gate() for _ in range(5)]
    assert [rc for rc, _ in worse] == [1] * 5, [doc["reason"] for _, doc in worse]
    print(f"\ngate on llama-server: {same[0][1]['reason']}; after the swap: {worse[0][1]['reason']}")
