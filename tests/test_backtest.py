"""Backtest: counters pulled from a real Prometheus (TSDB built by promtool) replay like the trace itself."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from specwatch.cli import main as cli_main
from specwatch.commands.backtest import _time
from specwatch.offline.backtest import Series, corrected_sum
from specwatch.config import Config
from specwatch.offline.replay import replay
from specwatch.offline.tracegen import Drop, TraceSpec, generate

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")


def test_engine_series_are_reset_corrected_before_summing() -> None:
    ts = [0.0, 15.0, 30.0, 45.0]
    a = Series({"engine": "0"}, {0.0: 100.0, 15.0: 110.0, 30.0: 5.0, 45.0: 15.0})  # restarts at 30
    b = Series({"engine": "1"}, {0.0: 50.0, 15.0: 60.0, 45.0: 80.0})  # a gap at 30 holds its value
    assert corrected_sum([a, b], ts) == {0.0: 150.0, 15.0: 170.0, 30.0: 175.0, 45.0: 205.0}


def test_time_arguments() -> None:
    assert _time("1700000000") == 1700000000.0
    assert _time("2023-11-14T22:13:20Z") == 1700000000.0
    assert abs(_time("now-1h") - (time.time() - 3600)) < 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openmetrics(samples, route: str) -> str:
    out = []
    for family, field in (
        ("specwatch_route_drafts", "drafts"),
        ("specwatch_route_draft_tokens", "draft_tokens"),
        ("specwatch_route_accepted_tokens", "accepted_tokens"),
    ):
        out.append(f"# TYPE {family} counter")
        out += [f'{family}_total{{route="{route}"}} {getattr(s, field):.0f} {s.ts:.0f}' for s in samples]
    for family, value in (
        ("specwatch_route_running_requests", lambda s: s.running),
        ("specwatch_route_waiting_requests", lambda s: 0),
    ):
        out.append(f"# TYPE {family} gauge")
        out += [f'{family}{{route="{route}"}} {value(s):.0f} {s.ts:.0f}' for s in samples]
    out.append("# TYPE specwatch_route_info gauge")
    out += [f'specwatch_route_info{{route="{route}",model_name="{s.model_name}"}} 1 {s.ts:.0f}' for s in samples]
    return "\n".join(out) + "\n# EOF\n"


@pytest.mark.e2e
@pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason="prometheus and promtool are not installed")
def test_backtest_against_a_real_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = float(int(time.time() // 3600 * 3600) - 10 * 3600)  # recent, so inside retention
    spec = TraceSpec(
        route="chat",
        rate=2.0,
        duration=8 * 3600.0,
        start=start,
        seed=21,
        drops=(Drop(start=5 * 3600.0, ratio=0.25, end=7 * 3600.0),),
    )
    samples = list(generate(spec))
    (tmp_path / "in.om").write_text(_openmetrics(samples, "chat"))
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "in.om"), str(tmp_path / "data")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    (tmp_path / "prometheus.yml").write_text("global: {}\nscrape_configs: []\n")
    port = _free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # a real server: wait until it answers
            try:
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        assert (
            cli_main(
                [
                    "backtest",
                    "--prometheus",
                    url,
                    "--route",
                    "chat",
                    "--start",
                    str(samples[0].ts),
                    "--end",
                    str(samples[-1].ts),
                    "--step",
                    "15s",
                ]
            )
            == 0
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = [json.loads(t.to_json()) for t in replay(samples, Config())]
    assert [g["state"] for g in got] == ["firing", "resolved"]
    assert [(g["ts"], g["state"]) for g in got] == [(e["ts"], e["state"]) for e in expected]
    assert got[0]["baseline"] == pytest.approx(expected[0]["baseline"], rel=1e-6)


@pytest.mark.slow
def test_backtest_reports_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()  # nothing listens there
    assert (
        cli_main(
            [
                "backtest",
                "--prometheus",
                f"http://127.0.0.1:{port}",
                "--route",
                "chat",
                "--start",
                "now-1h",
                "--end",
                "now",
            ]
        )
        == 1
    )
    assert f"127.0.0.1:{port}" in capsys.readouterr().err
