"""`specwatch check-config`, `status` and `run` (the last as a real process with signals and sd_notify)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from rich.console import Console

from specwatch.cli import main as cli_main
from specwatch.commands.status import render_status_table
from specwatch.export.http import serve
from specwatch.export.http import routes_document
from specwatch.snapshot import EMPTY_SNAPSHOT, RouteState, Snapshot

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "specwatch.yml"


# ---------------------------------------------------------------------------------------------- check-config
def test_check_config_lists_three_distinct_errors_and_exits_1(tmp_path, capsys):
    path = tmp_path / "bad.yml"
    path.write_text("interval: soon\nroutes:\n  - name: chat\n    url: localhost:8000\n    colour: blue\n")
    assert cli_main(["check-config", "--config.file", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"FAILED: {path}: 3 problem(s)" in err
    assert "interval: not a duration like 5s, 10m, 1h: 'soon'" in err
    assert "routes[0].url: not an http(s) URL: 'localhost:8000'" in err
    assert "routes[0].colour: unknown key" in err


def test_check_config_success_prints_a_summary(capsys):
    assert cli_main(["check-config", "--config.file", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "SUCCESS" in out and "3 route(s)" in out and "chat: vllm" in out


def test_check_config_missing_file(tmp_path, capsys):
    assert cli_main(["check-config", "--config.file", str(tmp_path / "nope.yml")]) == 1
    assert "cannot read file" in capsys.readouterr().err


def test_check_config_warns_but_passes_on_inline_secrets(tmp_path, capsys):
    path = tmp_path / "secrets.yml"
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o600)
    path.write_text(
        "scrape:\n  basic_auth: {username: u, password: hunter2}\n"
        "routes:\n"
        "  - {name: inherits, url: 'http://127.0.0.1:8000/metrics'}\n"
        "  - {name: token, url: 'http://127.0.0.1:8001/metrics', authorization: {credentials: s3cret}}\n"
        f"  - {{name: filed, url: 'http://127.0.0.1:8002/metrics', authorization: {{credentials_file: {token}}}}}\n"
    )
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING:")]
    assert warnings == [
        "WARNING: scrape.basic_auth.password: an inline secret, readable by whoever reads the config; "
        "put it in a file readable only by the service user and give password_file",
        "WARNING: routes[1] (token).authorization.credentials: an inline secret, readable by whoever reads the "
        "config; put it in a file readable only by the service user and give credentials_file",
    ]
    assert "hunter2" not in str(warnings) and "s3cret" not in str(warnings)


def test_check_config_warns_on_inline_secrets_of_seed_from_where_they_are_written(tmp_path, capsys):
    path = tmp_path / "seed.yml"
    path.write_text(
        "detection:\n  seed_from: {prometheus: 'http://p:9090', basic_auth: {username: u, password: hunter2}}\n"
        "routes:\n"
        "  - {name: inherits, url: 'http://127.0.0.1:8000/metrics'}\n"
        "  - name: own\n    url: 'http://127.0.0.1:8001/metrics'\n"
        "    detection: {seed_from: {prometheus: 'http://p:9090', authorization: {credentials: s3cret}}}\n"
    )
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING:")]
    assert warnings == [
        "WARNING: detection.seed_from.basic_auth.password: an inline secret, readable by whoever reads the config; "
        "put it in a file readable only by the service user and give password_file",
        "WARNING: routes[1] (own).detection.seed_from.authorization.credentials: an inline secret, readable by "
        "whoever reads the config; put it in a file readable only by the service user and give credentials_file",
    ]
    assert "hunter2" not in str(warnings) and "s3cret" not in str(warnings)


def test_check_config_warns_on_routes_without_gpus_under_a_dedicated_user(tmp_path, capsys):
    path = tmp_path / "gpus.yml"
    routes = "routes:\n  - {name: auto, url: 'http://127.0.0.1:8000/metrics'}\n"
    path.write_text(routes + "  - {name: pinned, url: 'http://127.0.0.1:8001/metrics', gpus: [0]}\n")
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", "specwatch"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: routes[0] (auto): no gpus: while specwatch runs as user specwatch" in err
    assert "set gpus:" in err and "(pinned)" not in err
    # Not under a dedicated user, or NVML off: the auto-mapping is not the problem.
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    assert "no gpus:" not in capsys.readouterr().err
    path.write_text("gpu: {enabled: 'false'}\n" + routes)
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", "specwatch"]) == 0
    assert "no gpus:" not in capsys.readouterr().err


def test_check_config_warns_where_the_routes_outnumber_the_scrape_threads_the_unit_allows(tmp_path, capsys):
    from specwatch.scrape_pool import MAX_THREADS

    path = tmp_path / "many.yml"

    def write(routes: int) -> None:
        path.write_text(
            "gpu: {enabled: 'false'}\nroutes:\n"
            + "".join(f"  - {{name: r{i}, url: 'http://127.0.0.1:8000/r{i}', gpus: [0]}}\n" for i in range(routes))
        )

    write(MAX_THREADS)
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    assert "scrape threads" not in capsys.readouterr().err
    write(MAX_THREADS + 1)
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    err = capsys.readouterr().err
    assert f"WARNING: {MAX_THREADS + 1} routes: more scrape calls a cycle ({MAX_THREADS + 1}) than the " in err
    assert f"the {MAX_THREADS} scrape threads the unit's TasksMax allows" in err and "overloaded" in err


def test_a_route_name_past_the_cap_is_an_error_quoting_only_its_start(tmp_path, capsys):
    from specwatch.config_schema import MAX_ROUTE_NAME_CHARS

    path = tmp_path / "long.yml"
    path.write_text(f"routes:\n  - name: {'a' * 100_000}\n    url: http://127.0.0.1:8000/metrics\n")
    assert cli_main(["check-config", "--config.file", str(path)]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"routes[0].name: 100000 characters, over the cap of {MAX_ROUTE_NAME_CHARS}: 'aaaa" in text
    assert "a" * 200 not in text
    path.write_text(f"routes:\n  - name: {'a' * MAX_ROUTE_NAME_CHARS}\n    url: http://127.0.0.1:8000/metrics\n")
    assert cli_main(["check-config", "--config.file", str(path)]) == 0


def test_the_dedicated_user_is_the_units_account_where_it_exists(monkeypatch):
    import pwd

    from specwatch import config_warnings

    unit = (Path(__file__).resolve().parent.parent / "systemd" / "specwatch.service").read_text()
    assert f"User={config_warnings.SERVICE_USER}\n" in unit
    monkeypatch.setattr(pwd, "getpwnam", lambda name: pwd.struct_passwd((name, "x", 990, 990, "", "/", "/bin/false")))
    assert config_warnings.dedicated_user() == "specwatch"

    def missing(name):
        raise KeyError(name)

    monkeypatch.setattr(pwd, "getpwnam", missing)
    assert config_warnings.dedicated_user() == ""


# ---------------------------------------------------------------------------------------------- extras
def test_an_offline_command_without_its_extra_says_how_to_install_it(monkeypatch, capsys):
    """grafanalib is not a daemon dependency: `generate` without it names the extra to install."""
    for name in list(sys.modules):
        if name == "grafanalib" or name.startswith(("grafanalib.", "specwatch.mixin", "specwatch.commands.generate")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "grafanalib", None)  # import grafanalib now fails as if not installed
    assert cli_main(["generate", "--check"]) == 2
    assert "pip install 'specwatch[mixin]'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_daemon_imports_no_offline_only_dependency():
    code = (
        "import sys; import specwatch.commands.run, specwatch.commands.check_config, specwatch.commands.status; "
        "print(sorted(m for m in ('matplotlib', 'grafanalib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------- status
def route(name: str, **kw) -> RouteState:
    return RouteState(name=name, **kw)


def table_text(doc) -> str:
    console = Console(width=250, record=True, file=open(os.devnull, "w"))
    console.print(render_status_table(doc))
    return console.export_text()


def test_status_table_shows_optional_columns_only_when_present():
    plain = Snapshot(
        timestamp=1.0,
        routes=(
            route(
                "chat",
                up=True,
                engine_kind="vllm",
                engine_version="0.33.0",
                model_name="llama",
                acceptance_source="counter",
                acceptance_ratio={"1m": 0.61, "5m": 0.6},
                draft_length=3.0,
                mean_acceptance_length={"5m": 2.8},
                running_requests=12.0,
                waiting_requests=0.0,
            ),
            route("code", up=False, error_reason="timeout"),
        ),
    )
    text = table_text(routes_document(plain))
    assert "chat" in text and "0.61 0.60 –" in text and "2.80" in text and "12/0" in text
    assert "DOWN timeout" in text
    assert "baseline" not in text and "xover" not in text and "verdict" not in text
    full = Snapshot(
        timestamp=1.0,
        routes=(
            route(
                "chat",
                up=True,
                acceptance_source="gauge",
                acceptance_ratio={"5m": 0.5},
                baseline_ratio=0.7,
                drop_ratio=0.2857,
                degraded=True,
                batch_size=40.0,
                crossover_batch_size=32.0,
                above_crossover=True,
            ),
        ),
    )
    text = table_text(routes_document(full)["routes"])  # the bare list works too
    assert "baseline" in text and "0.70 -28.6%" in text and "DEGRADED" in text
    assert "40.0/32.0" in text and "ABOVE" in text and "– 0.50* –" in text
    assert "GPU-h" not in text  # no speedup-predicting source: no ledger column
    ledger = Snapshot(
        timestamp=1.0,
        routes=(
            route(
                "code",
                up=True,
                batch_size=120.0,
                crossover_batch_size=64.4,
                above_crossover=True,
                speculation_gpu_seconds_lost_total=5400.0,
                speculation_gpu_seconds_saved_total=720.0,
            ),
        ),
    )
    text = table_text(routes_document(ledger))
    assert "GPU-h lost/saved" in text and "1.50/0.20" in text


def test_status_names_the_flags_source_its_band_and_the_live_bins():
    """batch/xover says what the flag judges against now: the source, that source's band, the threshold when
    it is not the B* shown, and the batch bins live calibration has, settled or not."""
    rows = [
        {
            "name": "swept",
            "up": True,
            "batch_size": 12.0,
            "crossover_batch_size": 32.0,
            "crossover_flag_source": "sweep",
            "crossover_flag_batch_size": 32.0,
        },
        {
            "name": "est",
            "up": True,
            "batch_size": 20.0,
            "crossover_batch_size": 23.7,
            "crossover_lower": 19.0,
            "crossover_upper": 29.0,
            "crossover_flag_source": "estimate",
            "crossover_flag_batch_size": 29.0,
            "live_crossover_bins": 3,
        },
        {
            "name": "calibrated",
            "up": True,
            "batch_size": 30.0,
            "crossover_batch_size": 23.7,
            "live_crossover_lower": 24.0,
            "live_crossover_upper": 28.5,
            "crossover_flag_source": "live",
            "crossover_flag_batch_size": 26.1,
            "live_crossover_bins": 5,
        },
        {
            "name": "open",
            "up": True,
            "batch_size": 30.0,
            "crossover_batch_size": 23.7,
            "crossover_lower": 19.0,
            "crossover_flag_source": "estimate",
            "crossover_flag_batch_size": None,
        },
    ]
    text = table_text(rows)
    assert "12.0/32.0 sweep" in text
    assert "20.0/23.7 estimate 19.0-29.0 flag>29.0 (3 bins)" in text
    assert "30.0/23.7 live 24.0-28.5 flag>26.1 (5 bins)" in text
    assert "30.0/23.7 estimate 19.0-– no flag" in text


def _every_column_snapshot() -> Snapshot:
    return Snapshot(
        timestamp=1.0,
        routes=(
            route(
                "chat-long-route-name",
                up=True,
                engine_kind="vllm",
                engine_version="0.33.0rc1.dev42",
                model_name="meta-llama/Llama-3.1-70B-Instruct-FP8-dynamic",
                acceptance_source="counter",
                acceptance_ratio={"1m": 0.61, "5m": 0.6, "1h": 0.62},
                draft_length=3.0,
                mean_acceptance_length={"5m": 2.8},
                running_requests=120.0,
                waiting_requests=14.0,
                baseline_ratio=0.7,
                drop_ratio=0.2857,
                degraded=True,
                batch_size=40.0,
                crossover_batch_size=32.0,
                above_crossover=True,
                speculation_gpu_seconds_lost_total=5400.0,
                speculation_gpu_seconds_saved_total=720.0,
            ),
        ),
    )


def test_status_watch_column_shows_the_shorter_horizon_and_flags_one_over_budget():
    snap = Snapshot(
        timestamp=1.0,
        routes=(
            route("busy", up=True, baseline_ratio=0.5, traffic_horizon_seconds=180.0, horizon_budget_seconds=3600.0),
            route("quiet", up=True, baseline_ratio=0.5, traffic_horizon_seconds=9000.0, horizon_budget_seconds=3600.0),
            route(
                "probed",
                up=True,
                baseline_ratio=0.5,
                traffic_horizon_seconds=9000.0,
                probe_horizon_seconds=1800.0,
                horizon_budget_seconds=3600.0,
            ),
            route("idle", up=True, baseline_ratio=0.5, traffic_horizon_seconds=365 * 86400.0),
        ),
    )
    lines = table_text(routes_document(snap)).splitlines()
    assert any("watch" in line for line in lines)
    row = {name: next(line for line in lines if f" {name} " in line) for name in ("busy", "quiet", "probed", "idle")}
    assert " 3m " in row["busy"] and " 2.5h " in row["quiet"] and " 30m probe " in row["probed"]
    assert " ∞ " in row["idle"]


def test_status_fits_an_80_column_terminal_by_dropping_named_columns_never_cutting_numbers():
    doc = routes_document(_every_column_snapshot())
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(render_status_table(doc, width=80))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "0.61 0.60 0.62" in text and "DEGRADED" in text and "ABOVE" in text  # acceptance and verdict stay
    assert "hidden to fit 80 columns: GPU-h lost/saved" in " ".join(text.split())
    # Every column kept shows whole values: no number ends in an ellipsis.
    assert not re.search(r"\d…", text)
    # A wide terminal hides nothing.
    wide = Console(width=250, record=True, file=open(os.devnull, "w"))
    wide.print(render_status_table(doc, width=250))
    wide_text = wide.export_text()
    assert "hidden" not in wide_text and "1.50/0.20" in wide_text and "120/14" in wide_text


@pytest.mark.slow
def test_status_against_a_live_daemon(capsys):
    snap = Snapshot(timestamp=time.time(), routes=(route("chat", up=True, acceptance_ratio={"1m": 0.7}),))
    server = serve("127.0.0.1:0", lambda: snap)
    try:
        assert cli_main(["status", "--url", server.url]) == 0
        assert "chat" in capsys.readouterr().out
    finally:
        server.shutdown()


@pytest.mark.slow
def test_status_unreachable_is_a_clear_message(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    assert cli_main(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert f"cannot reach specwatch at http://127.0.0.1:{port}" in out


# ---------------------------------------------------------------------------------------------- run
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, *routes: str, interval: str = "1s") -> None:
    lines = [
        f"interval: {interval}",
        "scrape: {timeout: 200ms}",
        "gpu: {enabled: false}",
        f"state_dir: {path.parent / 'state'}",
        "routes:",
    ]
    lines += [f"  - {{name: {r}, url: 'http://127.0.0.1:9/metrics'}}" for r in routes]
    path.write_text("\n".join(lines) + "\n" if routes else "\n".join(lines[:-1]) + "\n")


def metric(url: str, name: str) -> float | None:
    for line in requests.get(url + "/metrics", timeout=WAIT_TIMEOUT).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


# Generous on purpose: each wait ends as soon as its condition holds; only a failing test waits this long,
# and a loaded 2-core box can stall the daemon under test for many seconds.
WAIT_TIMEOUT = 60.0


def wait_for(predicate, timeout: float = WAIT_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform != "linux", reason="needs POSIX signals and AF_UNIX datagrams")
def test_run_serves_reloads_on_sighup_and_stops_cleanly_on_sigterm(tmp_path):
    config = tmp_path / "specwatch.yml"
    write_config(config, "chat")
    notify_path = str(tmp_path / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(WAIT_TIMEOUT)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "NOTIFY_SOCKET": notify_path}
    log = (tmp_path / "daemon.log").open("w")  # a file, not a pipe: a full pipe would block the daemon
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specwatch",
            "run",
            "--config.file",
            str(config),
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        messages = [notify.recv(4096).decode()]
        assert messages[0] == "READY=1"  # sent only after the first completed cycle
        assert requests.get(url + "/-/ready", timeout=WAIT_TIMEOUT).status_code == 200
        assert metric(url, 'specwatch_route_up{route="chat"}') == 0.0  # nothing listens on port 9
        assert metric(url, "specwatch_config_last_reload_successful") == 1.0

        config.write_text("interval: [not, a, duration]\nroutes: 7\n")  # rejected whole
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: metric(url, "specwatch_config_last_reload_successful") == 0.0)
        assert metric(url, 'specwatch_route_up{route="chat"}') == 0.0  # the old config keeps running

        write_config(config, "chat", "code")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: metric(url, "specwatch_config_last_reload_successful") == 1.0)
        wait_for(lambda: metric(url, 'specwatch_route_up{route="code"}') is not None)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_TIMEOUT) == 0
        while "STOPPING=1" not in messages:
            messages.append(notify.recv(4096).decode())
        output = (tmp_path / "daemon.log").read_text()
        assert "reload rejected" in output
        assert "interval: not a duration" in output and "routes: must be a list" in output
        assert "stopped" in output
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()
        log.close()


def test_run_refuses_a_bad_config(tmp_path, caplog):
    path = tmp_path / "bad.yml"
    path.write_text("routes: [{name: x}]\n")
    assert cli_main(["run", "--config.file", str(path), "--web.listen-address", "127.0.0.1:0"]) == 1
    assert any("routes[0].url: required" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_run_refuses_an_address_in_use(tmp_path, caplog):
    config = tmp_path / "ok.yml"
    write_config(config)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli_main(["run", "--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"]) == 1
    assert any("cannot listen on" in r.getMessage() for r in caplog.records)


def test_empty_snapshot_document():
    assert routes_document(EMPTY_SNAPSHOT)["routes"] == []


# ---------------------------------------------------------------------------------------------- flag names
def test_one_dotted_flag_per_concept_and_the_old_names_still_work_with_a_warning(capsys):
    from specwatch.cli import build_parser

    parser = build_parser()
    cases = [
        (["crossover", "estimate"], "--gamma", "--draft.length", "draft_length", "6"),
        (["simulate"], "--k", "--draft.length", "k", "6"),
        (["simulate-trace"], "--k", "--draft.length", "k", "6"),
        (["baseline"], "--state-dir", "--state.dir", "state_dir", "/tmp/x"),
        (["demo"], "--state-dir", "--state.dir", "state_dir", "/tmp/x"),
    ]
    for command, old, new, dest, value in cases:
        tail = ["list"] if command == ["baseline"] else []
        args = parser.parse_args([*command, new, value, *tail])
        assert str(getattr(args, dest)) == value and "deprecated" not in capsys.readouterr().err
        args = parser.parse_args([*command, old, value, *tail])
        assert str(getattr(args, dest)) == value, (command, old)
        assert f"{old} is deprecated, use {new}" in capsys.readouterr().err
        sub = build_parser(only=command[0])._subparsers._group_actions[0].choices[command[0]]
        if len(command) > 1:
            sub = sub._subparsers._group_actions[0].choices[command[1]]
        help_text = sub.format_help()
        assert new in help_text and old + " " not in help_text and old + "\n" not in help_text, command


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform != "linux", reason="needs POSIX signals")
def test_run_stops_in_seconds_on_sigterm_while_an_nvml_call_hangs(tmp_path):
    """A GPU whose NVML call never returns (one fallen off the bus): no thread can interrupt the call and
    concurrent.futures joins its threads at exit, which held `specwatch run` until systemd's 30 s stop timeout.
    The daemon now stops in seconds, exit 0, and names the call it left behind."""
    config = tmp_path / "specwatch.yml"
    write_config(config, "chat")
    config.write_text(config.read_text().replace("gpu: {enabled: false}", "gpu: {enabled: true}"))
    hang_nvml = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from testbed import fake_nvml; "
        "nvml = fake_nvml.basic_h200(1); nvml.gpus[0].hangs = frozenset({'nvmlDeviceGetTemperature'}); "
        "sys.modules['pynvml'] = nvml; from specwatch.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", hang_nvml, str(EXAMPLE.parents[1])]
        + ["run", "--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def ready() -> bool:
        try:
            return requests.get(url + "/-/ready", timeout=WAIT_TIMEOUT).status_code == 200
        except requests.ConnectionError:  # not listening yet
            return False

    try:
        wait_for(ready)
        assert metric(url, "specwatch_nvml_up") == 0.0  # the first cycle gave up on the hung call
        begin = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_TIMEOUT) == 0
        took = time.monotonic() - begin
        output = (tmp_path / "daemon.log").read_text()
        assert "stopped" in output
        assert "exiting with 1 source call(s) still hung" in output and "(GPU)" in output
        assert took < 20, f"took {took:.1f}s to stop"
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_a_commands_options_are_taken_after_its_action_too():
    from specwatch.cli import build_parser

    parser = build_parser()
    for argv in (
        ["baseline", "list", "--config.file", "F"],
        ["baseline", "--config.file", "F", "list"],
        ["baseline", "show", "chat", "--config.file=F"],
    ):
        args = parser.parse_args(argv)
        assert args.config_file == "F", argv
    args = parser.parse_args(["baseline", "--state.dir", "/x", "list", "--log.level", "debug"])
    assert (args.state_dir, args.log_level, args.action) == ("/x", "debug", "list")
    assert parser.parse_args(["baseline", "list"]).config_file is None  # the default still holds
