"""`engine: auto` names the engine of every committed fixture from its exposition alone."""

from __future__ import annotations

from pathlib import Path


import pytest

from specwatch.config import parse_config
from specwatch.sources.base import SourceError
from specwatch.sources.engines import parse_engine_sample

from specwatch.sources.engines import detect_kind

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "dynamo": "trtllm", "llamacpp": "llamacpp"}
# Every /metrics body (and TensorRT-LLM's JSON iteration stats); `responses/` folders hold API responses and
# `request_log/` SGLang's per-request files, not /metrics bodies.
BODIES = sorted(
    p
    for p in FIXTURES.rglob("*")
    if p.suffix in (".prom", ".json")
    and not p.name.endswith(".truth.json")
    and not {"responses", "request_log"} & set(p.relative_to(FIXTURES).parts)
)


def test_every_engine_directory_has_fixtures():
    assert {p.relative_to(FIXTURES).parts[0] for p in BODIES} == set(EXPECTED)


@pytest.mark.parametrize("path", BODIES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_auto_detects_the_engine(path):
    assert detect_kind(path.read_bytes()) == EXPECTED[path.relative_to(FIXTURES).parts[0]]


def test_other_expositions_name_no_engine():
    assert detect_kind(b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n") is None
    assert detect_kind(b'spec_decode_num_draft_tokens_total{backend="other"} 3\n') is None


def test_the_wrong_engine_for_an_endpoint_names_the_engine_it_serves():
    vllm_text = (Path(__file__).parent / "fixtures" / "vllm" / "v1_k4_2engines.prom").read_text()
    route = parse_config(
        {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "url": "http://h/m", "engine": "sglang"}]}
    )
    with pytest.raises(SourceError) as caught:
        parse_engine_sample("sglang", vllm_text, route.routes[0], 1.0)
    assert "serves vllm metrics, not sglang: set engine: vllm (or auto)" in str(caught.value)
    assert "--enable-metrics" not in str(caught.value)
