#!/usr/bin/env python3
"""The daemon's HTTP server (uvicorn, `specwatch.export.http`) against the hand-written asyncio server it
replaced, side by side in one run on the same hostile load. Loopback only; bounded in clients and seconds.

    .venv/bin/python bench/http_servers.py                  # about 3 minutes
    .venv/bin/python bench/http_servers.py --seconds 10 --old-rev 7c9c023

The hand-written server is loaded from git (`--old-rev`, the last commit that had it) into a temporary module;
everything else (RenderCache, web config, the Snapshot) is today's tree. Each phase starts a fresh server
process per server, then:

1. scrape: 200 clients scraping /metrics back to back on kept-alive connections and 100 slow clients
   trickling a request head a byte a second; a Prometheus-like scrape (OpenMetrics, gzip) every 0.25 s.
   Target: its p99 < 300 ms, none failed.
2. slowloris: 700 connections trickling request heads; the same Prometheus-like scrape. Target: every scrape
   answered within 1 s.
3. TLS + basic auth bursts: a fresh server with TLS and a bcrypt user (cost 10); 200 clients, each opening a
   new TLS connection per request with the right password. Target: 0 connection errors (resets), 0 ERROR
   lines or tracebacks in the server's log.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

USER, PASSWORD = "prometheus", "scrape-secret"


# ---------------------------------------------------------------------------------------------- server side
def serve_child(kind: str, old_rev: str, web_dir: str) -> None:
    import logging
    from dataclasses import replace

    from http_load import snapshot

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s", stream=sys.stderr)
    if kind == "old":
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{old_rev}:specwatch/export/http.py"], check=True, capture_output=True
        ).stdout
        path = Path(tempfile.mkdtemp()) / "hand_written_http.py"
        path.write_bytes(source)
        spec = importlib.util.spec_from_file_location("hand_written_http", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        serve = module.serve
    else:
        from specwatch.export.http import serve
    web_config = None
    if web_dir:
        from specwatch.export.webconfig import load_web_config

        web_config = load_web_config(Path(web_dir) / "web.yml")
    current = {"snapshot": snapshot(time.time())}
    server = serve("127.0.0.1:0", lambda: current["snapshot"], web_config)
    print(server.port, flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.wait(5.0):  # a new Snapshot every 5 s, as the daemon publishes one
        current["snapshot"] = replace(current["snapshot"], timestamp=time.time())
    server.shutdown()


def make_web_config(directory: Path) -> Path:
    import bcrypt

    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "tls.key", "-out", "tls.crt", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    (directory / "web.yml").write_text(
        f"tls_server_config: {{cert_file: tls.crt, key_file: tls.key}}\nbasic_auth_users: {{{USER}: '{hashed}'}}\n"
    )
    return directory / "tls.crt"


# ---------------------------------------------------------------------------------------------- load side
def trickle(port: int, count: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """`count` connections, each sending a request head a byte a second (never whole), reopened when cut; one
    thread for all of them."""
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000
    selector = selectors.DefaultSelector()
    conns: dict[socket.socket, int] = {}

    def open_one() -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return
        sock.setblocking(False)
        conns[sock] = 0
        selector.register(sock, selectors.EVENT_READ)
        counts["slow_opened"] += 1

    def drop(sock: socket.socket) -> None:
        conns.pop(sock, None)
        selector.unregister(sock)
        sock.close()
        counts["slow_cut"] += 1

    while not stop.is_set():
        while len(conns) < count and not stop.is_set():
            open_one()
        counts["slow_held_min"] = min(counts.get("slow_held_min", count), len(conns))
        for key, _ in selector.select(timeout=0):  # readable: an answer or the close
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if not sock.recv(65536):
                    drop(sock)
            except OSError:
                drop(sock)
        for sock in list(conns):
            try:
                sock.send(head[conns[sock] : conns[sock] + 1])
                conns[sock] += 1
            except OSError:
                drop(sock)
        stop.wait(1.0)
    for sock in conns:
        sock.close()


def load_child(port: int, mode: str, clients: int, slow: int, ca: str) -> None:
    import requests

    stop = threading.Event()
    counts = {"ok": 0, "failed": 0, "slow_opened": 0, "slow_cut": 0}
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def scraper() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    status = session.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code
                    ok, reason = status == 200, f"status {status}"
                except requests.RequestException as exc:
                    ok, reason = False, type(exc).__name__
                with lock:
                    counts["ok" if ok else "failed"] += 1
                    if not ok:
                        errors[reason] = errors.get(reason, 0) + 1

    def burster() -> None:
        while not stop.is_set():
            try:  # no Session: a new TLS connection and basic auth every time
                answer = requests.get(f"https://127.0.0.1:{port}/metrics", auth=(USER, PASSWORD), verify=ca, timeout=10)
                ok, reason = answer.status_code == 200, f"status {answer.status_code}"
            except requests.RequestException as exc:
                ok, reason = False, type(exc).__name__ + (": reset" if "reset" in str(exc).lower() else "")
            with lock:
                counts["ok" if ok else "failed"] += 1
                if not ok:
                    errors[reason] = errors.get(reason, 0) + 1

    begin = time.monotonic()
    threads = [threading.Thread(target=trickle, args=(port, slow, stop, counts), daemon=True)] if slow else []
    threads += [threading.Thread(target=scraper if mode == "scrape" else burster, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    sys.stdin.read()
    stop.set()
    elapsed = time.monotonic() - begin
    for t in threads:
        t.join(15)
    print(json.dumps({**counts, "per_second": counts["ok"] / elapsed, "errors": errors}), flush=True)


# ---------------------------------------------------------------------------------------------- the driver
def run_phase(kind: str, phase: str, args: argparse.Namespace, web_dir: str, ca: str) -> dict:
    log_path = Path(tempfile.mkstemp(prefix=f"http-{kind}-{phase}-", suffix=".log")[1])
    with log_path.open("w") as log_file:
        server = subprocess.Popen(
            [sys.executable, __file__, "_serve", kind, args.old_rev, web_dir if phase == "burst" else ""],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdin is not None
        port = server.stdout.readline().strip()
        clients, slow = {"scrape": (200, 100), "slowloris": (0, 700), "burst": (200, 0)}[phase]
        mode = "burst" if phase == "burst" else "scrape"
        load = subprocess.Popen(
            [sys.executable, __file__, "_load", port, mode, str(clients), str(slow), ca],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            time.sleep(3.0)  # let the load connect
            if phase == "burst":
                time.sleep(args.seconds)
                latencies, failures = [], 0
            else:
                from http_load import probe

                latencies, failures = probe(int(port), args.seconds)
        finally:
            assert load.stdin is not None and load.stdout is not None
            load.stdin.close()
            held = json.loads(load.stdout.read().strip().splitlines()[-1])
            load.wait(30)
            server.stdin.close()
            server.wait(30)
    text = log_path.read_text(errors="replace")
    log_path.unlink()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan")
    return {
        "latencies": latencies,
        "p50_ms": statistics.median(latencies) * 1e3 if latencies else float("nan"),
        "p99_ms": p99 * 1e3,
        "max_ms": latencies[-1] * 1e3 if latencies else float("nan"),
        "probe_failed": failures,
        "load": held,
        "log_errors": sum(1 for line in text.splitlines() if line.startswith(("ERROR", "CRITICAL"))),
        "tracebacks": text.count("Traceback (most recent call last)"),
        "log_bytes": len(text),
    }


def merge(runs: list[dict]) -> dict:
    """One figure per server and phase from its rounds: latencies pooled, counts summed, held the least."""
    latencies = sorted(x for r in runs for x in r["latencies"])
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan")
    loads = [r["load"] for r in runs]
    errors: dict[str, int] = {}
    for load in loads:
        for reason, n in load["errors"].items():
            errors[reason] = errors.get(reason, 0) + n
    return {
        "p50_ms": statistics.median(latencies) * 1e3 if latencies else float("nan"),
        "p99_ms": p99 * 1e3,
        "max_ms": latencies[-1] * 1e3 if latencies else float("nan"),
        "probe_failed": sum(r["probe_failed"] for r in runs),
        "load": {
            "per_second": statistics.mean(x["per_second"] for x in loads),
            "failed": sum(x["failed"] for x in loads),
            "slow_held_min": min((x.get("slow_held_min", 0) for x in loads), default=0),
            "slow_cut": sum(x["slow_cut"] for x in loads),
            "errors": errors,
        },
        "log_errors": sum(r["log_errors"] for r in runs),
        "tracebacks": sum(r["tracebacks"] for r in runs),
        "log_bytes": sum(r["log_bytes"] for r in runs),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        serve_child(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        load_child(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each phase runs per server")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every phase, the servers' order alternating")
    parser.add_argument("--old-rev", default="7c9c023", help="a commit with the hand-written server")
    args = parser.parse_args()
    web_dir = tempfile.mkdtemp(prefix="http-servers-")
    ca = str(make_web_config(Path(web_dir)))
    runs: dict[tuple[str, str], list[dict]] = {}
    for n in range(args.rounds):  # alternating order, so a drift in the machine's load hits both alike
        for phase in ("scrape", "slowloris", "burst"):
            for kind in ("old", "new") if n % 2 == 0 else ("new", "old"):
                runs.setdefault((phase, kind), []).append(run_phase(kind, phase, args, web_dir, ca))
    results = {key: merge(value) for key, value in runs.items()}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
          f"{args.rounds} round(s) of {args.seconds:g} s per phase and server")  # fmt: skip
    print(f"{'':44} {'hand-written':>22} {'uvicorn':>22}")

    def row(label: str, phase: str, fmt) -> None:  # noqa: ANN001
        print(f"{label:44} {fmt(results[(phase, 'old')]):>22} {fmt(results[(phase, 'new')]):>22}")

    lat = lambda r: f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} / {r['max_ms']:.0f} ms"
    row("scrape: probe p50 / p99 / max", "scrape", lat)
    row("scrape: probe failed", "scrape", lambda r: str(r["probe_failed"]))
    row(
        "scrape: 200 scrapers' scrapes/s (failed)",
        "scrape",
        lambda r: f"{r['load']['per_second']:.0f} ({r['load']['failed']})",
    )
    row("scrape: slow clients held at least", "scrape", lambda r: str(r["load"].get("slow_held_min")))
    row("slowloris 700: probe p50 / p99 / max", "slowloris", lat)
    row("slowloris 700: probe failed", "slowloris", lambda r: str(r["probe_failed"]))
    row(
        "slowloris 700: held at least (cut by the server)",
        "slowloris",
        lambda r: f"{r['load'].get('slow_held_min')} ({r['load']['slow_cut']})",
    )
    row("TLS+auth burst: requests ok / s", "burst", lambda r: f"{r['load']['per_second']:.0f}")
    row("TLS+auth burst: failed requests", "burst", lambda r: str(r["load"]["failed"]))
    row("TLS+auth burst: server log ERROR lines", "burst", lambda r: str(r["log_errors"]))
    row("TLS+auth burst: tracebacks (log bytes)", "burst", lambda r: f"{r['tracebacks']} ({r['log_bytes']})")
    for kind in ("old", "new"):
        errors = results[("burst", kind)]["load"]["errors"]
        if errors:
            print(f"  {kind} burst failures: {errors}")
    verdict = {}
    for kind in ("old", "new"):
        scrape, slowloris, burst = (results[(p, kind)] for p in ("scrape", "slowloris", "burst"))
        verdict[kind] = {
            "p99 < 300 ms": scrape["p99_ms"] < 300 and not scrape["probe_failed"],
            "slowloris max < 1 s": slowloris["max_ms"] < 1000 and not slowloris["probe_failed"],
            "burst 0 failed": burst["load"]["failed"] == 0,
            "burst 0 ERROR/tracebacks": burst["log_errors"] == 0 and burst["tracebacks"] == 0,
        }
    for target in verdict["old"]:
        old, new = ("PASS" if verdict[kind][target] else "MISS" for kind in ("old", "new"))
        print(f"{'target ' + target:44} {old:>22} {new:>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
