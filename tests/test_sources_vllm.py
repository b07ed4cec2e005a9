"""vLLM fixtures -> EngineSample, against the counters the capture fed vLLM; and the HTTP source's failures."""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.config import parse_config
from specwatch.snapshot import StepTimes
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import detect_kind, make_source, parse_engine_sample

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
STEP_SAMPLES = (
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:iteration_tokens_total_count",
)
V1 = ["v1_k4_2engines", "v1_k4_2engines_scrape2", "v1_k1_1engine", "v1_k1_1engine_scrape2"]


def route(**extra):
    raw = {"name": "r", "url": "http://127.0.0.1:9/metrics", "engine": "vllm", **extra}
    return parse_config({"gpu": {"enabled": "false"}, "routes": [raw]}).routes[0]


def fixture(name):
    return (FIXTURES / f"{name}.prom").read_bytes(), json.loads((FIXTURES / f"{name}.truth.json").read_text())


@pytest.mark.parametrize("name", V1)
def test_v1_fixture_yields_the_fed_counters_per_engine(name):
    body, truth = fixture(name)
    sample = parse_engine_sample("vllm", body, route(), 5.0, version="0.33.0")
    assert (sample.engine_kind, sample.acceptance_source, sample.speculation_enabled) == ("vllm", "counter", True)
    assert sample.model_name == "llama-3.1-8b-instruct" and sample.engine_version == "0.33.0" and sample.ts == 5.0
    assert [e.engine for e in sample.engines] == sorted(truth)
    for engine in sample.engines:
        fed = truth[engine.engine]
        assert sample.num_speculative_tokens == fed["k"] == len(engine.accepted_per_pos)
        assert (engine.drafts, engine.draft_tokens, engine.accepted_tokens, engine.generation_tokens) == (
            fed["drafts"],
            fed["draft_tokens"],
            fed["accepted_tokens"],
            fed["generation_tokens"],
        )
        assert list(engine.accepted_per_pos) == fed["accepted_per_pos"]
        assert engine.created and engine.created > 1.7e9, "single-process vLLM exposes _created"
        assert engine.running is not None and engine.waiting is not None and 0 <= engine.kv_usage <= 1


@pytest.mark.parametrize("name", ["v1_k4_2engines", "v1_k1_1engine"])
def test_step_times_carry_the_engine_steps_beside_the_step_time_histogram(name):
    """Per engine: the inter-token-latency histogram's sum and count, and the iteration-tokens histogram's
    count (one per engine step), read independently here with prometheus_client's parser."""
    body, truth = fixture(name)
    expected: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name in STEP_SAMPLES:
                expected[(sample.labels["engine"], sample.name)] = sample.value
    sample = parse_engine_sample("vllm", body, route(), 5.0)
    assert sorted(sample.step_time_totals) == sorted(truth)
    for engine, times in sample.step_time_totals.items():
        assert times == StepTimes(
            expected[(engine, "vllm:inter_token_latency_seconds_sum")],
            expected[(engine, "vllm:inter_token_latency_seconds_count")],
            expected[(engine, "vllm:iteration_tokens_total_count")],
        )
        assert times.steps and times.observations > times.steps  # more than one request decoding a step


def test_speculation_off_reports_load_but_no_acceptance():
    body, _ = fixture("v1_nospec_1engine")
    sample = parse_engine_sample("auto", body, route(engine="auto"), 1.0)
    assert (sample.speculation_enabled, sample.acceptance_source) == (False, "none")
    assert sample.num_speculative_tokens is None
    (engine,) = sample.engines
    assert engine.drafts is None and engine.accepted_per_pos == () and engine.running is not None


def test_v0_reads_lifetime_gauges_and_never_its_counters():
    body, truth = fixture("v0_lifetime_gauges")
    sample = parse_engine_sample("vllm", body, route(), 1.0)
    assert (sample.engine_kind, sample.acceptance_source) == ("vllm-v0", "lifetime_gauge")
    (engine,) = sample.engines
    assert engine.lifetime_acceptance_ratio == pytest.approx(truth["lifetime_acceptance_rate"])
    assert engine.drafts is None and engine.draft_tokens is None and engine.accepted_tokens is None
    assert engine.kv_usage == 0.31, "falls back to gpu_cache_usage_perc"


def test_positions_sort_numerically_and_k_counts_them():
    lines = "".join(
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{p}"}} {100 - p}\n'
        for p in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)
    )
    body = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100\n' + lines
    sample = parse_engine_sample("vllm", body, route(), 1.0)
    assert sample.num_speculative_tokens == 11
    assert sample.engines[0].accepted_per_pos == tuple(float(100 - p) for p in range(11))


def test_match_and_engines_filters():
    body, truth = fixture("v1_k4_2engines")
    only_one = parse_engine_sample("vllm", body, route(engines=[1]), 1.0)
    assert [e.engine for e in only_one.engines] == ["1"] and only_one.engines[0].drafts == truth["1"]["drafts"]
    assert parse_engine_sample("vllm", body, route(match={"model_name": "llama-3.1-8b-instruct"}), 1.0).engines
    with pytest.raises(NoData):
        parse_engine_sample("vllm", body, route(match={"model_name": "other"}), 1.0)
    with pytest.raises(NoData, match="modle_name"):
        parse_engine_sample("vllm", body, route(match={"modle_name": "llama-3.1-8b-instruct"}), 1.0)
    with pytest.raises(NoData):
        parse_engine_sample("vllm", body, route(engines=[7]), 1.0)


def test_openmetrics_escaped_names_are_read_as_vllm_names():
    body, truth = fixture("v1_k4_2engines")
    escaped = body.replace(b"\nvllm:", b"\nvllm_")
    sample = parse_engine_sample("vllm", escaped, route(), 1.0)
    assert sample.engines[0].drafts == truth["0"]["drafts"]


@pytest.mark.parametrize("value", ["NaN", "-Inf", "-3"])
def test_unusable_counter_values_become_absent_not_wrong(value):
    body = f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {value}\n'
    assert parse_engine_sample("vllm", body, route(), 1.0).engines[0].drafts is None


def test_errors_have_reasons():
    with pytest.raises(SourceError) as info:
        parse_engine_sample("vllm", b"<!DOCTYPE html><html></html>", route(), 1.0)
    assert info.value.reason == "parse"
    with pytest.raises(SourceError) as info:
        parse_engine_sample("vllm", b"# TYPE up gauge\nup 1\n", route(), 1.0)
    assert info.value.reason == "no_spec_metrics"
    dup = b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 1\n' * 2
    with pytest.raises(SourceError) as info:
        parse_engine_sample("vllm", dup, route(), 1.0)
    assert info.value.reason == "parse"
    assert detect_kind(b"# HELP sglang:num_running_reqs x\n") == "sglang" and detect_kind(b"up 1\n") is None


# ------------------------------------------------------------------------------------------------- HTTP
TIMEOUT = 0.5
GOOD, _ = fixture("v1_k1_1engine")
SGLANG = (FIXTURES.parent / "sglang" / "0.5.23_dp2.prom").read_bytes()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output quiet
        pass

    def send(self, status, body, kind="text/plain; version=0.0.4", length=True):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path
        if path == "/metrics":
            self.send(200, self.server.body)
        elif path == "/version":
            self.server.version_calls += 1
            self.send(200, b'{"version": "0.33.0"}', "application/json")
        elif path == "/slow-version":  # answers after `version_hangs` requests it lets time out
            if self.server.version_hangs > 0:
                self.server.version_hangs -= 1
                self.server.stop.wait(TIMEOUT * 4)
                return
            self.send(200, b'{"version": "0.33.0"}', "application/json")
        elif path == "/get_server_info":  # SGLang's; the server also answers vLLM's /version above
            info = {"version": "0.5.23", "tp_size": 1, **self.server.sglang_speculative}
            self.send(200, json.dumps(info).encode(), "application/json")
        elif path == "/sglang/metrics":
            self.send(200, SGLANG)
        elif path == "/gzip/metrics":
            body = gzip.compress(GOOD)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/hang/metrics":
            self.server.stop.wait(5)
        elif path == "/drip/metrics":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100):  # a byte every 50 ms: every read makes progress
                if self.server.stop.wait(0.05):
                    return
                self.wfile.write(b"#")
                self.wfile.flush()
        elif path == "/huge/metrics":
            self.send_response(200)
            self.end_headers()  # no Content-Length: only streaming can catch it
            chunk = b"# " + b"x" * 65534 + b"\n"
            try:
                for _ in range(1600):  # 100 MiB
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif path == "/html/metrics":
            self.send(200, b"<html><body>login</body></html>", "text/html")
        elif path == "/binary/metrics":
            self.send(200, bytes(range(256)) * 64, "application/octet-stream")
        elif path == "/utf8/metrics":
            self.send(200, GOOD.replace(b'model_name="', b'model_name="\xff', 1))
        elif path == "/500/metrics":
            self.send(500, b"internal error")
        else:
            self.send(404, b"not found")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.stop = threading.Event()
    httpd.version_calls = 0
    httpd.version_hangs = 0
    # server_args' field names (sglang/srt/server_args.py:493-494 in 0.5.10, arg_groups/fields/spec.py in 0.5.23)
    httpd.sglang_speculative = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/m/draft-a"}
    httpd.body = GOOD
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.stop.set()
    httpd.shutdown()
    httpd.server_close()


def http_source(url, version_url="", **scrape_cfg):
    config = parse_config(
        {
            "interval": "5s",
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": f"{TIMEOUT * 1000:g}ms", **scrape_cfg},
            "routes": [{"name": "r", "url": url, "engine": "auto", "version_url": version_url}],
        }
    )
    return make_source(config.routes[0], config)


def scrape(url, **scrape_cfg):
    source = http_source(url, **scrape_cfg)
    begin = time.monotonic()
    try:
        return source.sample(1.0), time.monotonic() - begin
    except SourceError as exc:
        return exc, time.monotonic() - begin
    finally:
        source.close()


@pytest.mark.slow
def test_http_good_scrape_fetches_the_version_once_and_again_after_a_restart(server):
    source = http_source(f"{server.url}/metrics")
    try:
        before = server.version_calls
        samples = [source.sample(float(t)) for t in range(3)]
        assert all(s.engine_kind == "vllm" and s.engine_version == "0.33.0" and s.engines for s in samples)
        assert server.version_calls == before + 1, "cached after the first success"
        server.body = re.sub(rb"(vllm:spec_decode_num_drafts_created\{[^}]*\} )\S+", rb"\g<1>1.9e9", GOOD)
        assert source.sample(3.0).engines[0].created == 1.9e9 and source.sample(4.0).engine_version == "0.33.0"
        assert server.version_calls == before + 2, "a restart may be an upgrade: asked again"
    finally:
        server.body = GOOD
        source.close()


@pytest.mark.slow
def test_an_engine_too_busy_to_tell_its_version_never_gets_a_versionless_baseline_key(server, caplog):
    """A version read as "" is another baseline key (a model change, or a stored baseline not found), so an
    unanswered /version is asked again: a new engine's scrape fails meanwhile, a known one keeps its version."""
    source = http_source(f"{server.url}/metrics", version_url=f"{server.url}/slow-version")
    try:
        server.version_hangs = 1
        with pytest.raises(SourceError, match=r"engine version \(1 of 3 tries\)") as failed:
            source.sample(1.0)
        assert failed.value.reason == "timeout"
        assert source.sample(2.0).engine_version == "0.33.0"
        # Restarted, and busy: the sample keeps the version told before while it is asked again.
        server.version_hangs = 1
        server.body = re.sub(rb"(vllm:spec_decode_num_drafts_created\{[^}]*\} )\S+", rb"\g<1>1.9e9", GOOD)
        assert source.sample(3.0).engine_version == "0.33.0"
        assert source.sample(4.0).engine_version == "0.33.0" and server.version_hangs == 0
    finally:
        server.body = GOOD
        server.version_hangs = 0
        source.close()
    # Never told: after three scrapes the version is taken as unknown, said once.
    source = http_source(f"{server.url}/metrics", version_url=f"{server.url}/slow-version")
    try:
        server.version_hangs = 3
        for t in (1.0, 2.0):
            with pytest.raises(SourceError, match="engine version"):
                source.sample(t)
        assert source.sample(3.0).engine_version == ""
        assert "did not tell its version in 3 scrapes" in caplog.text
    finally:
        server.version_hangs = 0
        source.close()


@pytest.mark.slow
def test_http_sglang_is_detected_and_its_version_read_from_server_info(server):
    result, _ = scrape(f"{server.url}/sglang/metrics")
    assert (result.engine_kind, result.engine_version, len(result.engines)) == ("sglang", "0.5.23", 2)


@pytest.mark.slow
def test_http_sglang_tells_its_speculative_algorithm_and_draft_model_in_its_server_info(server):
    result, _ = scrape(f"{server.url}/sglang/metrics")
    assert (result.spec_method, result.spec_drafter) == ("EAGLE3", "/m/draft-a")
    server.sglang_speculative = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/m/draft-b"}
    try:
        result, _ = scrape(f"{server.url}/sglang/metrics")
        assert result.spec_drafter == "/m/draft-b"  # a drafter swap at the same method and k: another key
        server.sglang_speculative = {"speculative_algorithm": None, "speculative_draft_model_path": None}
        result, _ = scrape(f"{server.url}/sglang/metrics")
        assert (result.spec_method, result.spec_drafter) == ("", "")  # not told: the route's config may name them
    finally:
        server.sglang_speculative = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/m/draft-a"}


@pytest.mark.slow
def test_http_gzip_body_is_decoded(server):
    result, _ = scrape(f"{server.url}/gzip/metrics")
    assert not isinstance(result, SourceError) and result.engines[0].drafts


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, reason",
    [
        ("/hang/metrics", "timeout"),
        ("/drip/metrics", "timeout"),
        ("/html/metrics", "parse"),
        ("/binary/metrics", "parse"),
        ("/utf8/metrics", "parse"),
        ("/500/metrics", "http_status"),
    ],
)
def test_http_failures_fail_fast_with_their_reason(server, path, reason):
    result, took = scrape(server.url + path)
    assert isinstance(result, SourceError) and result.reason == reason, repr(result)
    assert took < TIMEOUT + 1.0, f"{path} took {took:.2f}s"  # the engine would hang for 10 s


@pytest.mark.slow
def test_http_oversized_body_is_cut_at_the_cap(server):
    result, took = scrape(f"{server.url}/huge/metrics", max_body_bytes=1 << 20)
    assert isinstance(result, SourceError) and result.reason == "too_large"
    assert took < TIMEOUT + 1.0


def test_http_refused_connection():
    result, _ = scrape("http://127.0.0.1:9/metrics")
    assert isinstance(result, SourceError) and result.reason == "connection"


def test_a_misspelled_match_value_is_no_match():
    text = (Path(__file__).parent / "fixtures" / "vllm" / "v1_k4_2engines.prom").read_text()
    raw = {"name": "r", "url": "http://127.0.0.1:9/metrics", "engine": "vllm", "match": {"model_name": "llama-3.1-8b"}}
    config_route = parse_config({"gpu": {"enabled": "false"}, "routes": [raw]}).routes[0]
    with pytest.raises(NoData) as caught:
        parse_engine_sample("vllm", text, config_route, 2.0)
    assert caught.value.reason == "no_match" and "'llama-3.1-8b-instruct'" in str(caught.value)


def test_a_counter_family_declared_a_gauge_is_refused_with_its_reason():
    body, _ = fixture("v1_k1_1engine")
    text = body.decode()
    declared = "# TYPE vllm:spec_decode_num_accepted_tokens_total counter"
    assert declared in text
    with pytest.raises(SourceError) as raised:
        parse_engine_sample("vllm", text.replace(declared, declared.replace("counter", "gauge")), route(), 1.0)
    assert raised.value.reason == "not_a_counter" and "vllm:spec_decode_num_accepted_tokens_total" in str(raised.value)
    # no TYPE line at all (a bare exposition) is taken at its word
    bare = "\n".join(line for line in text.splitlines() if not line.startswith("# TYPE")) + "\n"
    assert parse_engine_sample("vllm", bare, route(), 1.0).engines[0].accepted_tokens is not None
