"""Replay: trace parsing, the daemon's reset-safe observations, JSON transitions and the CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from specwatch.cli import main as cli_main
from specwatch.config import Config, DetectionConfig
from specwatch.offline.replay import ObservationBuilder, TraceError, TraceSample, parse_line, read_trace, replay
from specwatch.offline.tracegen import DAY, Drop, TraceSpec, generate

FAST = Config(detection=DetectionConfig(warmup_drafted_tokens=20_000, warmup_seconds=1800.0))


def _sample(
    ts: float, drafts: float, tokens: float, accepted: float, model: str = "m", per_pos: tuple[float, ...] = ()
) -> TraceSample:
    return TraceSample(
        ts=ts,
        route="chat",
        model_name=model,
        drafts=drafts,
        draft_tokens=tokens,
        accepted_tokens=accepted,
        accepted_per_pos=per_pos,
    )


def test_parse_line_accepts_the_documented_format() -> None:
    line = (
        '{"ts": 1700000000, "route": "chat", "model_name": "m", "drafts": 10, "draft_tokens": 40, '
        '"accepted_tokens": 21, "accepted_per_pos": [8, 6, 4, 3], "running": 3}'
    )
    s = parse_line(line, 1)
    assert s == TraceSample(
        ts=1700000000.0,
        route="chat",
        model_name="m",
        drafts=10.0,
        draft_tokens=40.0,
        accepted_tokens=21.0,
        accepted_per_pos=(8.0, 6.0, 4.0, 3.0),
        running=3.0,
    )
    assert parse_line("   \n") is None
    assert parse_line(s.to_json()) == s


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "line 7"),
        ('{"ts": 1, "route": "r", "drafts": 1, "draft_tokens": 4}', "missing key 'accepted_tokens'"),
        ('{"ts": 1, "route": "r", "drafts": "x", "draft_tokens": 4, "accepted_tokens": 1}', "not a finite number"),
        (
            '{"ts": 1, "route": "r", "drafts": 1, "draft_tokens": 4, "accepted_tokens": 1, "accepted_per_pos": 3}',
            "must be a list",
        ),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_parse_line_names_the_bad_line(line: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_line(line, 7)


def test_observations_are_reset_safe_deltas() -> None:
    b = ObservationBuilder("chat")
    first = b.observe(_sample(0, 100, 400, 200, per_pos=(80, 60, 40, 20)))
    assert first.d_draft_tokens == 0 and not first.reset  # first sight: history predates us
    obs = b.observe(_sample(15, 150, 600, 290, per_pos=(120, 85, 55, 30)))
    assert (obs.d_drafts, obs.d_draft_tokens, obs.d_accepted) == (50, 200, 90)
    assert obs.d_accepted_per_pos == (40, 25, 15, 10) and obs.k == 4 and not obs.reset
    restarted = b.observe(_sample(30, 20, 80, 30, model="m2", per_pos=(15, 8, 5, 2)))
    assert restarted.reset and restarted.d_draft_tokens == 80 and restarted.model_name == "m2"


def test_replay_emits_firing_then_resolved() -> None:
    spec = TraceSpec(rate=2.0, duration=DAY / 2, seed=3, drops=(Drop(start=6 * 3600.0, ratio=0.25, end=8 * 3600.0),))
    transitions = list(replay(generate(spec), FAST))
    assert [t.state for t in transitions] == ["firing", "resolved"]
    firing = json.loads(transitions[0].to_json())
    assert set(firing) == {"ts", "route", "alert", "state", "baseline", "current", "predicted_horizon_seconds"}
    assert firing["alert"] == "acceptance_degraded" and firing["route"] == "chat"
    assert firing["current"] < 0.9 * firing["baseline"]  # the window may still hold a little pre-drop traffic
    assert 6 * 3600 < transitions[0].ts - spec.start < 6 * 3600 + 300


@pytest.mark.slow
def test_replay_keeps_routes_apart() -> None:
    a = list(
        generate(TraceSpec(route="a", rate=2.0, duration=DAY / 3, seed=1, drops=(Drop(start=5 * 3600.0, ratio=0.3),)))
    )
    b = list(generate(TraceSpec(route="b", rate=2.0, duration=DAY / 3, seed=2)))
    merged = sorted(a + b, key=lambda s: (s.ts, s.route))
    assert {t.route for t in replay(merged, FAST)} == {"a"}


def test_cli_replay_prints_json_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    spec = TraceSpec(rate=2.0, duration=DAY / 2, seed=3, drops=(Drop(start=6 * 3600.0, ratio=0.25),))
    trace.write_text("".join(s.to_json() + "\n" for s in generate(spec)))
    config = tmp_path / "specwatch.yml"
    config.write_text("detection:\n  warmup_drafted_tokens: 20000\n  warmup_duration: 30m\n")
    assert cli_main(["replay", str(trace), "--config.file", str(config)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["state"] for x in lines] == ["firing", "end"]
    firing, end = lines
    assert end["route"] == "chat" and end["degraded"] is True and end["ts"] == spec.start + spec.duration
    # The horizon predicted at the page, scored against when the page came after the drop began.
    took = firing["ts"] - spec.start - 6 * 3600
    print(f"predicted {firing['predicted_horizon_seconds']} s, paged after {took:.0f} s")
    assert 0 < firing["predicted_horizon_seconds"] < 4 * 3600 and 0 < took < 4 * 3600


def test_cli_replay_reports_a_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(_sample(0, 1, 4, 2).to_json() + "\n{oops\n")
    assert cli_main(["replay", str(trace)]) == 1
    assert "line 2" in capsys.readouterr().err


@pytest.mark.slow
def test_thirty_days_of_15s_samples_replay_quickly() -> None:
    samples = list(generate(TraceSpec(rate=2.0, duration=30 * DAY, seed=1)))
    assert len(samples) == 172_800
    started = time.process_time()
    assert list(replay(samples, Config())) == []
    assert time.process_time() - started < 30.0  # ~6 s CPU on the dev box; "well under a minute"


def test_read_trace_skips_blank_lines() -> None:
    lines = [_sample(0, 1, 4, 2).to_json(), "", _sample(15, 2, 8, 4).to_json()]
    assert [s.ts for s in read_trace(lines)] == [0.0, 15.0]
