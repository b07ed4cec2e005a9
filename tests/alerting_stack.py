"""A real Prometheus and Alertmanager around a specwatch daemon, for the end-to-end tests.

Shared by the alerting tests on simulated engines (test_e2e_alerting.py) and on the real vLLM engine
(test_real_vllm_alerting.py): subprocesses that log to files and are all stopped at the end, a webhook
receiver standing in for the pager, the Prometheus and Alertmanager configs built from our generated rules and
example Alertmanager config, and Prometheus queries.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from specwatch.mixin import render
from specwatch.mixin.settings import DEFAULT

REPO = Path(__file__).resolve().parents[1]

# The real `specwatch run`, with testbed/fake_nvml.py standing in for the pynvml module (no GPU here).
DAEMON_WITH_FAKE_NVML = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from testbed import fake_nvml; "
    "sys.modules['pynvml'] = fake_nvml.basic_h200(1); "
    "from specwatch.cli import main; sys.exit(main(sys.argv[1:]))"
)


def binaries() -> dict[str, str]:
    """Paths of prometheus and alertmanager, installing them when missing; skips the module if that fails."""
    names = {"prometheus": "prometheus", "alertmanager": "prometheus-alertmanager"}
    if not all(shutil.which(n) for n in names.values()):
        subprocess.run(["bash", str(REPO / "scripts" / "ensure_prometheus.sh")], capture_output=True, timeout=300)
    found = {key: shutil.which(name) for key, name in names.items()}
    missing = [names[key] for key, path in found.items() if path is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed and scripts/ensure_prometheus.sh could not install them")
    return {key: str(path) for key, path in found.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(*names: str) -> dict[str, int]:
    """One free port per name, all different: the sockets stay bound until every port is picked, so the kernel
    cannot hand the same port out twice (free_port() called in a row can)."""
    held = []
    try:
        for _ in names:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return {name: s.getsockname()[1] for name, s in zip(names, held)}
    finally:
        for s in held:
            s.close()


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, procs: "Processes") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive()
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{procs.logs()}")


class Processes:
    """Subprocesses of this test, each logging to its own file; all stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, argv: list[str], stdin: bool = False) -> subprocess.Popen:
        """Start `argv` logging to NAME.log; with `stdin`, its standard input is a pipe the caller writes to."""
        log = self.workdir / f"{name}.log"
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.running.append((name, proc, log))
        return proc

    def log_of(self, name: str) -> Path:
        return next(log for n, _, log in self.running if n == name)

    def check_alive(self) -> None:
        for name, proc, _ in self.running:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def logs(self, tail: int = 25) -> str:
        parts = []
        for name, _, log in self.running:
            # The scheduler's per-tick INFO lines would push everything useful out of the tail.
            lines = [line for line in log.read_text(errors="replace").splitlines() if "apscheduler" not in line][-tail:]
            parts.append(f"--- {name} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop_all(self) -> None:
        for _, proc, _ in reversed(self.running):
            if proc.stdin is not None:
                proc.stdin.close()
            if proc.poll() is None:
                proc.terminate()
        for _, proc, _ in self.running:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


class Webhook:
    """Alertmanager's webhook receiver: records (arrival time, path, payload) of every notification."""

    def __init__(self) -> None:
        self.notifications: list[tuple[float, str, dict]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    outer.notifications.append((time.monotonic(), self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, path: str) -> list[tuple[float, dict, dict]]:
        """(arrival, alert, notification) for every alert posted to `path`."""
        with self.lock:
            return [(t, alert, body) for t, p, body in self.notifications if p == path for alert in body["alerts"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_config(
    workdir: Path,
    daemon_port: int,
    am_port: int,
    evaluation_interval_seconds: float = 1.0,
    alert_for: str = "5s",
    fleet_targets: tuple[str, ...] = (),
) -> Path:
    """Our generated rules with every `for:` shortened, scraping and evaluating every second, generated as a site
    that pages on every kind of acceptance drop does (`--severity.drop=critical --severity.model_change=critical
    --severity.canary=critical`), so the page path is the one under test."""
    settings = replace(
        DEFAULT.with_all_for(alert_for),
        evaluation_interval_seconds=evaluation_interval_seconds,
        severity_drop="critical",
        severity_model_change="critical",
        severity_canary="critical",
    )
    rules = workdir / "specwatch-rules.yaml"
    rules.write_text(render.to_yaml(render.rules_document(settings)))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "specwatch", "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"]}]}],
    }
    if fleet_targets:  # other specwatch nodes, as a fleet's (job "fleet")
        config["scrape_configs"].append({"job_name": "fleet", "static_configs": [{"targets": list(fleet_targets)}]})
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def generate_site(workdir: Path, settings: dict[str, Any]) -> tuple[Path, Path]:
    """`specwatch generate --settings FILE --out-dir DIR`, as a site renders its own rules: `settings` holds
    specwatch/mixin/settings.py fields. Returns (recording and alert rules, Alertmanager example config)."""
    site = workdir / "site"
    (workdir / "site-settings.yaml").write_text(yaml.safe_dump(settings))
    subprocess.run(
        [sys.executable, "-m", "specwatch", "generate", "--settings", str(workdir / "site-settings.yaml")]
        + ["--out-dir", str(site)],
        check=True,
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    return site / render.RULES_PATH, site / render.ALERTMANAGER_PATH


def alertmanager_config(
    workdir: Path,
    webhook: Webhook,
    example: Path = REPO / render.ALERTMANAGER_PATH,
    timing: dict[str, str] | None = None,
) -> Path:
    """The generated Alertmanager `example` with its receivers pointed at `webhook` (/page, /ticket) and the
    top route's group_wait, group_interval and repeat_interval replaced by `timing` (default 1s, 1s, 1m)."""
    config = yaml.safe_load(example.read_text())
    urls = {DEFAULT.page_receiver: f"{webhook.url}/page", DEFAULT.ticket_receiver: f"{webhook.url}/ticket"}
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = urls[receiver["name"]]
    config["route"].update(timing or {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1m"})
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_alertmanager(procs: Processes, workdir: Path, config: Path, port: int) -> str:
    """A real Alertmanager with `config` on 127.0.0.1:`port`, clustering off; returns its URL."""
    procs.start(
        "alertmanager",
        [
            binaries()["alertmanager"],
            f"--config.file={config}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
    )
    return f"http://127.0.0.1:{port}"


def start_prometheus(procs: Processes, workdir: Path, config: Path, port: int) -> str:
    """A real Prometheus with `config` on 127.0.0.1:`port`; returns its URL."""
    procs.start(
        "prometheus",
        [
            binaries()["prometheus"],
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
    )
    return f"http://127.0.0.1:{port}"


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def query_or_error(prometheus: str, expr: str) -> tuple[list[dict], str]:
    """Instant query: (result vector, "") or ([], what went wrong)."""
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:  # Prometheus answers 400/422 with a JSON error body
        text = exc.read()
        try:
            body = json.loads(text or b"{}")
        except ValueError:  # 503 in plain text while its storage is still starting
            return [], f"HTTP {exc.code}: {text[:200]!r}"
    except (OSError, ValueError) as exc:
        return [], f"{type(exc).__name__}: {exc}"
    if body.get("status") != "success":
        return [], f"{body.get('errorType', '?')}: {body.get('error', body)}"
    return body["data"]["result"], ""


def query(prometheus: str, expr: str) -> list[dict]:
    return query_or_error(prometheus, expr)[0]


def query_range(prometheus: str, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
    """Range query: the matrix of (timestamp, value) series; raises on an error (a broken query is a bug)."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    url = f"{prometheus}/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    assert body.get("status") == "success", body
    return body["data"]["result"]


def start_alerting(
    procs: Processes,
    workdir: Path,
    webhook: Webhook,
    ports: dict[str, int],
    evaluation_interval_seconds: float = 1.0,
    alert_for: str = "5s",
    fleet_targets: tuple[str, ...] = (),
    wait_for_daemon: bool = True,
) -> tuple[str, str]:
    """Start Alertmanager (the example config, receivers pointed at `webhook`) and Prometheus (our rules,
    scraping the daemon on ports["daemon"]) on ports["alertmanager"] and ports["prometheus"]; wait until
    Prometheus scrapes the daemon (unless not `wait_for_daemon`); `fleet_targets` are scraped as job "fleet".
    Returns (Prometheus URL, Alertmanager URL). Skips if they cannot be had."""
    binaries()  # skips the test here when they cannot be had
    alertmanager = start_alertmanager(procs, workdir, alertmanager_config(workdir, webhook), ports["alertmanager"])
    config = prometheus_config(
        workdir, ports["daemon"], ports["alertmanager"], evaluation_interval_seconds, alert_for, fleet_targets
    )
    prometheus = start_prometheus(procs, workdir, config, ports["prometheus"])
    if wait_for_daemon:
        wait_until("Prometheus to scrape specwatch", lambda: query(prometheus, 'up{job="specwatch"} == 1'), 60, procs)
    return prometheus, alertmanager
