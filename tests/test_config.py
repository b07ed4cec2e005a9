"""Strict config: every problem reported at once with its path; nothing half-valid is returned."""

from __future__ import annotations

import re
from dataclasses import MISSING
from pathlib import Path

import pytest
import yaml

from specwatch import config as config_module
from specwatch.config import Config, ConfigError, RouteConfig, load_config, parse_config, parse_duration, summarize
from specwatch.config_schema import Custom, Section, options

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "specwatch.yml"
ROUTE = {"name": "chat", "url": "http://127.0.0.1:8000/metrics"}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.problems


def test_minimal_and_empty_configs_use_defaults():
    assert parse_config(None) == Config()
    cfg = parse_config({"routes": [ROUTE]})
    assert cfg.interval_seconds == 5.0 and cfg.scrape.timeout_seconds == 2.0 and cfg.gpu.enabled == "auto"
    route = cfg.routes[0]
    assert route.engine == "auto" and route.gpus is None and route.detection == cfg.detection
    assert route.detection.drop == 0.15


def test_example_config_is_valid():
    cfg = load_config(EXAMPLE)
    assert [r.name for r in cfg.routes] == ["chat", "code", "batch"]
    chat = cfg.route("chat")
    assert chat.detection.drop == 0.2 and chat.engines == ("0", "1") and chat.gpus == (0, 1)
    assert {r.crossover.kind for r in cfg.routes} == {"sweep", "estimate", "batch_size"}
    assert cfg.route("code").detection.cusum_threshold == 30
    assert cfg.route("code").detection.min_drafted_tokens == cfg.detection.min_drafted_tokens  # inherited


def walk_example(raw: dict, cls: type, path: str, seen: set, shown: list) -> None:
    """Walk the example along the schema: `seen` gets each (dataclass, YAML key) shown, `shown` each option
    with its path and raw value."""
    flat = {
        sub.yaml: (o, sub)
        for o in options(cls)
        if isinstance(o.spec, Section) and o.spec.flat
        for sub in options(o.spec.of)
    }
    by_key = {o.yaml: (cls, o) for o in options(cls) if o.yaml}
    by_key.update({key: (o.spec.of, sub) for key, (o, sub) in flat.items()})
    for key, value in raw.items():
        if key not in by_key:  # a shorthand (a route's drop), read by the section's check
            continue
        owner, o = by_key[key]
        seen.add((owner, key))
        p = f"{path}.{key}" if path else key
        if isinstance(o.spec, Section):
            walk_example(value, o.spec.of, p, seen, shown)
        elif key == "routes":
            for i, route in enumerate(value):
                walk_example(route, RouteConfig, f"routes[{i}]", seen, shown)
        else:
            shown.append((p, o, value))


def schema_keys(cls: type, out: set) -> set:
    for o in options(cls):
        if isinstance(o.spec, Section):
            if not o.spec.flat:
                out.add((cls, o.yaml))
            schema_keys(o.spec.of, out)
        else:
            out.add((cls, o.yaml))
    if cls is Config:
        schema_keys(RouteConfig, out)
    return out


def example_walk() -> tuple[set, list]:
    seen: set = set()
    shown: list = []
    walk_example(yaml.safe_load(EXAMPLE.read_text()), Config, "", seen, shown)
    return seen, shown


def test_example_config_shows_every_key():
    """Every option of every section appears in examples/specwatch.yml (a schema shared by several paths, like
    detection at the top and per route, may be shown at any of them)."""
    seen, _ = example_walk()
    missing = sorted(f"{cls.__name__}.{key}" for cls, key in schema_keys(Config, set()) - seen)
    assert missing == [], f"examples/specwatch.yml does not show: {missing}"


# Values the example sets on purpose to show a use, not to state a default.
ILLUSTRATIVE = re.compile(
    r"^routes\[\d+\]\.(engine|drop|detection\.|crossover\.estimate\.draft|crossover\.estimate\.dtype$)"
)


def has_default(o) -> bool:
    return o.default is not MISSING and (isinstance(o.default, bool) or o.default not in (None, "", (), {}))


def test_example_config_states_each_default_it_shows():
    """ "every key, with its default where it has one": each value the example shows (outside the deliberate
    per-route illustrations) reads as the option's default, so the example cannot drift from the code."""
    _, shown = example_walk()
    checked = []
    for path, o, value in shown:
        if not has_default(o) or ILLUSTRATIVE.match(path) or isinstance(o.spec, Custom):
            continue
        checker = config_module._Checker()
        assert checker.value(o.spec, value, path, None) == o.default, (path, value, o.default)
        checked.append(path)
    for must in ("interval", "scrape.max_series", "detection.cusum_threshold", "routes[1].probe.every"):
        assert must in checked, checked


def test_all_problems_are_reported_together():
    raw = {
        "interval": "5 parsecs",
        "bogus": 1,
        "scrape": {"timeout": "10s", "max_body_bytes": 10},
        "gpu": {"enabled": "maybe"},
        "routes": [
            {"name": "a b", "url": "ftp://x", "engine": "tgi"},
            {"url": "http://h:1/metrics"},
            {"name": "dup", "url": "http://h:1/metrics"},
            {"name": "dup", "url": "http://h:2/metrics", "surprise": True},
        ],
    }
    found = problems(raw)
    expected = [
        "interval: not a duration",
        "bogus: unknown key",
        "scrape.max_body_bytes: must be >= 1024",
        "gpu.enabled: must be one of auto, true, false",
        "routes[0].name: only letters, digits and _.:- are allowed",
        "routes[0].url: not an http(s) URL",
        "routes[0].engine: must be one of vllm, sglang, trtllm, llamacpp, auto",
        "routes[1].name: required",
        "routes[3].surprise: unknown key",
        "routes[3].name: duplicate route name 'dup' (first at routes[2])",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in found), (want, found)


@pytest.mark.parametrize(
    "raw, want",
    [
        ([1, 2], ": must be a mapping, got list"),
        ({"routes": {"name": "x"}}, "routes: must be a list"),
        ({"routes": ["chat"]}, "routes[0]: must be a mapping, got str"),
        ({"interval": "0s"}, "interval: must be at least 0.1s"),
        ({"interval": True}, "interval: not a duration"),
        ({"interval": "2s", "scrape": {"timeout": "2s"}}, "scrape.timeout: must be shorter than interval (2s)"),
        ({"scrape": {"max_body_bytes": 2048.5}}, "scrape.max_body_bytes: must be a whole number"),
        ({"state_dir": 5}, "state_dir: must be a string"),
        ({"detection": {"drop": 0}}, "detection.drop: must be > 0"),
        ({"detection": {"drop": 0.99}}, "detection.drop: must be <= 0.95"),
        ({"detection": {"drop": "15%"}}, "detection.drop: must be a number"),
        ({"detection": {"drop": float("nan")}}, "detection.drop: must be a number"),
        ({"detection": {"cusum_threshold": 0}}, "detection.cusum_threshold: must be > 0"),
        ({"detection": {"warmup_drafted_tokens": -1}}, "detection.warmup_drafted_tokens: must be >= 0"),
        ({"detection": {"typo": 1}}, "detection.typo: unknown key"),
        ({"otlp": {}}, "otlp.endpoint: required"),
        ({"otlp": {"endpoint": "collector:4318"}}, "otlp.endpoint: not an http(s) URL"),
        ({"otlp": {"endpoint": "http://c:4318", "protocol": "udp"}}, "otlp.protocol: must be one of"),
        ({"otlp": {"endpoint": "http://c:4318", "headers": {"a": [1]}}}, "otlp.headers.a: must be a string"),
        ({"routes": [{**ROUTE, "gpus": 0}]}, "routes[0].gpus: must be a list"),
        ({"routes": [{**ROUTE, "gpus": [-1]}]}, "routes[0].gpus[0]: must be >= 0"),
        ({"routes": [{**ROUTE, "engines": "0"}]}, "routes[0].engines: must be a list"),
        ({"routes": [{**ROUTE, "engines": [True]}]}, "routes[0].engines[0]: must be an engine index"),
        ({"routes": [{**ROUTE, "match": ["model"]}]}, "routes[0].match: must be a mapping of strings"),
        ({"routes": [{**ROUTE, "version_url": "localhost/version"}]}, "routes[0].version_url: not an http(s) URL"),
        ({"routes": [{**ROUTE, "drop": 2}]}, "routes[0].drop: must be <= 0.95"),
        ({"routes": [{**ROUTE, "baseline": {}}]}, "routes[0].baseline.acceptance_ratio: required"),
        (
            {"routes": [{**ROUTE, "baseline": {"acceptance_ratio": 1.5}}]},
            "routes[0].baseline.acceptance_ratio: must be <=",
        ),
        (
            {"routes": [{**ROUTE, "baseline": {"acceptance_ratio": 0.6, "position_acceptance": [0.9, 2]}}]},
            "routes[0].baseline.position_acceptance[1]: must be <= 1",
        ),
        (
            {"routes": [{**ROUTE, "baseline": {"acceptance_ratio": 0.6, "overdispersion": 0.5}}]},
            "routes[0].baseline.overdispersion: must be >= 1",
        ),
        (
            {"routes": [{**ROUTE, "crossover": {}}]},
            "routes[0].crossover: give exactly one of sweep, estimate, batch_size",
        ),
        (
            {"routes": [{**ROUTE, "crossover": {"batch_size": 8, "sweep": "s.json"}}]},
            "routes[0].crossover: give exactly one",
        ),
        ({"routes": [{**ROUTE, "crossover": {"batch_size": 0}}]}, "routes[0].crossover.batch_size: must be > 0"),
        (
            {"routes": [{**ROUTE, "crossover": {"estimate": {"draft": "medusa"}}}]},
            "routes[0].crossover.estimate.draft: must be eagle, eagle3, mtp, ngram or model:<billions>",
        ),
        ({"routes": [{**ROUTE, "crossover": {"estimate": {"dtype": "fp64"}}}]}, "routes[0].crossover.estimate.dtype"),
        (
            {"routes": [{**ROUTE, "crossover": {"estimate": {"layers": 1.5}}}]},
            "routes[0].crossover.estimate.layers: must be a whole number",
        ),
    ],
)
def test_each_problem_names_its_path(raw, want):
    found = problems(raw)
    assert any(p.startswith(want) for p in found), (want, found)


def test_route_detection_inherits_and_overrides():
    cfg = parse_config(
        {
            "detection": {"drop": 0.1, "cusum_threshold": 12},
            "routes": [{**ROUTE, "detection": {"cusum_threshold": 30}}, {**ROUTE, "name": "b", "drop": 0.3}],
        }
    )
    a, b = cfg.routes
    assert a.detection.drop == 0.1 and a.detection.cusum_threshold == 30
    assert b.detection.drop == 0.3 and b.detection.cusum_threshold == 12


def test_durations():
    assert parse_duration("500ms") == 0.5 and parse_duration("10m") == 600 and parse_duration("1d") == 86400
    assert parse_duration(3) == 3.0 and parse_duration(" 2 h ") == 7200
    for bad in ("5 parsecs", "-1s", True, None, float("inf"), "1m30s"):
        assert parse_duration(bad) is None


def test_load_config_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "missing.yml")
    bad_yaml = tmp_path / "bad.yml"
    bad_yaml.write_text("routes: [\n  - name: x\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad_yaml)
    binary = tmp_path / "bin.yml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(binary)


def test_config_error_message_lists_every_problem_with_the_file(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump({"interval": "x", "routes": [{"name": "r"}]}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: 2 problem(s)")
    assert "interval: not a duration" in text and "routes[0].url: required" in text


def test_summarize_names_every_route():
    text = summarize(load_config(EXAMPLE))
    assert "3 route(s)" in text and all(name in text for name in ("chat:", "code:", "batch:"))


def test_example_config_states_the_real_detection_defaults():
    """examples/specwatch.yml promises "every key, with its default": its top-level detection section must
    parse to exactly the DetectionConfig defaults, so the example cannot drift from the code."""
    from pathlib import Path

    from specwatch.config import DetectionConfig, load_config

    example = load_config(Path(__file__).resolve().parent.parent / "examples" / "specwatch.yml")
    assert example.detection == DetectionConfig()
