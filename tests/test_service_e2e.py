"""The service end to end: a real `specwatch run` subprocess, driven by signals and scraped over HTTP(S).

- SIGHUP with a broken config: still serving, the old routes still there, reload metric 0;
  SIGHUP with a good config: reload metric 1 and the new route visible.
- SIGTERM: exit status 0, with a clean log.
- With a web config: /metrics answers 401 without credentials and 200 with them, over TLS.

Routes point at a closed loopback port and NVML is off, so each test needs nothing but loopback; the
interval is 300ms so cycles, and therefore reloads, are visible within a second.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import bcrypt
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import test_otel
from test_webconfig import make_pki

pytestmark = pytest.mark.e2e  # real daemon processes: about 15 s for the module on a busy 2-core box
receiver = test_otel.receiver  # the OTLP receiver fixture, shared

# Generous on purpose: a wait ends as soon as its event happens, and a 2-core box shared with other builds
# can stall a daemon for many seconds. Only a failing test ever waits this long.
STARTUP_TIMEOUT = 60.0
WAIT_TIMEOUT = 60.0
CLOSED_PORT_URL = "http://127.0.0.1:9/metrics"  # discard port: connection refused, instantly


def write_config(path: Path, routes: list[str], extra: str = "") -> Path:
    lines = [
        "interval: 300ms",
        "scrape: {timeout: 200ms}",
        f"state_dir: {path.parent / 'state'}",
        "gpu: {enabled: false}",
        "routes:",
    ]
    lines += [f"  - {{name: {name}, engine: vllm, url: '{CLOSED_PORT_URL}'}}" for name in routes]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class Daemon:
    """`specwatch run` in a subprocess; its log is collected line by line as it runs."""

    def __init__(self, config: Path, *extra_args: str, env: dict | None = None, python_prelude: str = "") -> None:
        args = ["run", f"--config.file={config}", "--web.listen-address=127.0.0.1:0", *extra_args]
        # The prelude lets a test instrument the daemon in-process (e.g. block a tick) before the CLI starts.
        code = python_prelude + "\nimport sys\nfrom specwatch.cli import main\nsys.exit(main(sys.argv[1:]))"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--log.level=debug", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self.wait_for_log(r"listening on (https?://[^\s,]+)").group(1)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def wait_for_log(self, pattern: str, timeout: float = STARTUP_TIMEOUT, start: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log[start:]:
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no log line matching {pattern!r}; log:\n" + "\n".join(self.log))

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = WAIT_TIMEOUT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(timeout=5)


@pytest.fixture
def daemons():
    started: list[Daemon] = []

    def start(*args, **kwargs) -> Daemon:
        d = Daemon(*args, **kwargs)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def scrape(url: str, **kwargs) -> dict[tuple[str, tuple], float]:
    response = requests.get(url + "/metrics", timeout=5, **kwargs)
    response.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def wait_until(predicate, timeout: float = WAIT_TIMEOUT, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def routes_in(metrics: dict) -> set[str]:
    return {dict(labels)["route"] for (name, labels) in metrics if name == "specwatch_route_up"}


# --------------------------------------------------------------------------- reload
def test_sighup_rejects_a_broken_config_and_applies_a_good_one(tmp_path, daemons):
    config = write_config(tmp_path / "specwatch.yml", ["chat"])
    d = daemons(config)
    wait_until(lambda: requests.get(d.url + "/-/ready", timeout=5).ok, what="/-/ready")
    before = scrape(d.url)
    assert routes_in(before) == {"chat"}
    assert before[("specwatch_config_last_reload_successful", ())] == 1
    loaded_at = before[("specwatch_config_last_reload_success_timestamp_seconds", ())]

    config.write_text("interval: fast\nroutes: [{name: code}]\nsurprise: 1\n")
    mark = len(d.log)
    d.signal(signal.SIGHUP)
    d.wait_for_log(r"reload rejected", start=mark)
    after_bad = wait_until(
        lambda: (m := scrape(d.url))[("specwatch_config_last_reload_successful", ())] == 0 and m, what="reload metric 0"
    )
    assert d.proc.poll() is None
    assert routes_in(after_bad) == {"chat"}  # the old config keeps running
    assert after_bad[("specwatch_config_last_reload_success_timestamp_seconds", ())] == loaded_at
    problems = "\n".join(d.log[mark:])
    for problem in ("interval", "routes[0].url: required", "surprise: unknown key"):
        assert problem in problems  # every problem is logged, not just the first

    write_config(config, ["chat", "code"])
    mark = len(d.log)
    d.signal(signal.SIGHUP)
    d.wait_for_log(r"configuration reloaded", start=mark)  # the event; the new route shows from the next cycle
    after_good = wait_until(
        lambda: (
            (m := scrape(d.url))[("specwatch_config_last_reload_successful", ())] == 1 and "code" in routes_in(m) and m
        ),
        what="reload metric 1 and route code",
    )
    assert routes_in(after_good) == {"chat", "code"}
    assert after_good[("specwatch_config_last_reload_success_timestamp_seconds", ())] > loaded_at


# --------------------------------------------------------------------------- shutdown
def test_sigterm_finishes_the_cycle_and_exits_0(tmp_path, daemons):
    d = daemons(write_config(tmp_path / "specwatch.yml", ["chat"]))
    wait_until(lambda: requests.get(d.url + "/-/ready", timeout=5).ok, what="/-/ready")
    assert requests.get(d.url + "/-/healthy", timeout=5).status_code == 200
    d.signal(signal.SIGTERM)
    assert d.stop() == 0
    assert any("stopped" in line for line in d.log)
    assert not any("Traceback" in line for line in d.log), "\n".join(d.log)


def test_sigterms_repeated_until_it_has_exited_still_end_in_exit_0(tmp_path, daemons):
    """Python restores default handlers while it tears down; a SIGTERM landing then was death by signal."""
    d = daemons(write_config(tmp_path / "specwatch.yml", ["chat"]))
    wait_until(lambda: requests.get(d.url + "/-/ready", timeout=5).ok, what="/-/ready")  # handlers installed
    deadline = time.monotonic() + WAIT_TIMEOUT
    while d.proc.poll() is None and time.monotonic() < deadline:
        d.signal(signal.SIGTERM)
        time.sleep(0.002)
    assert d.proc.wait(timeout=5) == 0, "\n".join(d.log)


def test_a_bad_config_at_start_exits_1_with_every_problem(tmp_path):
    config = tmp_path / "specwatch.yml"
    config.write_text("routes: [{name: 'bad name'}]\nbogus: 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "specwatch", "run", f"--config.file={config}", "--web.listen-address=127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "bogus: unknown key" in result.stderr and "routes[0].url: required" in result.stderr


# --------------------------------------------------------------------------- TLS and basic auth
def test_tls_and_basic_auth_on_a_running_daemon(tmp_path, daemons):
    pki = make_pki(tmp_path)
    password = "scrape-me"
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config: {{cert_file: server.crt, key_file: server.key}}\n"
        f"basic_auth_users: {{prometheus: '{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}'}}"
        "\n"
    )
    d = daemons(write_config(tmp_path / "specwatch.yml", ["chat"]), f"--web.config.file={web}")
    assert d.url.startswith("https://127.0.0.1:")
    ca = str(pki["ca.crt"])

    anonymous = requests.get(d.url + "/metrics", verify=ca, timeout=5)
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
    assert b"specwatch_" not in anonymous.content
    wrong = requests.get(d.url + "/metrics", verify=ca, auth=("prometheus", "guess"), timeout=5)
    assert wrong.status_code == 401
    assert wrong.content == anonymous.content  # a wrong password reads exactly like no password
    unknown = requests.get(d.url + "/metrics", verify=ca, auth=("root", password), timeout=5)
    assert unknown.status_code == 401 and unknown.content == anonymous.content

    metrics = scrape(d.url, verify=ca, auth=("prometheus", password))
    assert routes_in(metrics) == {"chat"}
    with pytest.raises(requests.ConnectionError):  # no plaintext fallback: plain HTTP is closed unanswered
        requests.get(d.url.replace("https://", "http://") + "/metrics", timeout=5)


def test_a_bad_web_config_stops_the_start(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "specwatch",
            "run",
            f"--config.file={write_config(tmp_path / 'specwatch.yml', ['chat'])}",
            "--web.listen-address=127.0.0.1:0",
            f"--web.config.file={web}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "missing.crt: No such file or directory" in result.stderr and "missing.key" in result.stderr


# --------------------------------------------------------------------------- OTLP
def test_otlp_push_from_a_running_daemon(tmp_path, daemons, receiver):
    from test_otel import points

    base, received = receiver
    config = write_config(tmp_path / "specwatch.yml", ["chat"], extra=f"otlp: {{endpoint: '{base}', interval: 1s}}\n")
    d = daemons(config)
    wait_until(lambda: any("specwatch_route_up" in points(r) for _, _, r in received), what="an OTLP export")
    exported = next(points(r) for _, _, r in received if "specwatch_route_up" in points(r))
    assert exported["specwatch_route_up"] == [(0.0, {"route": "chat"})]  # the route's engine is unreachable
    assert exported["specwatch_config_last_reload_successful"] == [(1.0, {})]
    count = len(received)
    assert d.stop() == 0
    assert len(received) > count  # the last snapshot is flushed on SIGTERM
