#!/usr/bin/env python3
"""The whole daemon on a real GPU host: `specwatch run` with NVML on, against an engine stand-in that holds the GPU.

The stand-in is one process that (a) runs a SIMULATED vLLM engine (specwatch's simulator: real exposition format,
moving counters) on a loopback port and (b) keeps the GPU busy with bf16 matmuls, so it is an NVML compute process
listening on the route's port: the route -> GPU auto-mapping has something real to find. The route config names
no `gpus:`. Prints the exported lines that matter, the daemon's CPU per cycle, and writes the full /metrics.

Usage (needs torch with CUDA, nvidia-ml-py, apscheduler):  PYTHONPATH=. python3 bench/gpu_daemon_check.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

STAND_IN = textwrap.dedent("""
    import sys, threading, time, torch
    from specwatch.simulator.launch import start_inprocess
    from specwatch.simulator.scenario import Scenario
    from specwatch.simulator.simulation import SimulationSpec
    sim = start_inprocess(SimulationSpec(engine_kind="vllm", dp=2, k=4, acceptance=0.7, time_scale=5.0,
                                         scenario=Scenario(load=16)), port=int(sys.argv[1]))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    def burn():
        while True:
            (a @ a).sum().item()
    threading.Thread(target=burn, daemon=True).start()
    print("ready", flush=True)
    time.sleep(3600)
""")

KEEP = re.compile(
    r"^specwatch_(nvml_up|gpu_up|gpu_info|route_gpu_info|route_up|route_info|gpu_tensor_active_ratio|"
    r"gpu_dram_bandwidth_utilization_ratio|gpu_sm_active_ratio|route_acceptance_ratio|"
    r"route_draft_length|route_running_requests|route_compute_bound|evaluation_duration_seconds)\b"
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--cycles", type=int, default=15)
    args = parser.parse_args()
    out = Path(args.out)
    engine_port, daemon_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp())
    engine = subprocess.Popen([sys.executable, "-c", STAND_IN, str(engine_port)], stdout=subprocess.PIPE, text=True)
    assert engine.stdout.readline().strip() == "ready", "engine stand-in did not start"
    interval = 2.0
    (tmp / "specwatch.yml").write_text(
        textwrap.dedent(f"""
        interval: {interval}s
        state_dir: {tmp}/state
        gpu: {{enabled: true}}
        routes:
          - {{name: chat, engine: vllm, url: "http://127.0.0.1:{engine_port}/metrics"}}
    """)
    )
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specwatch",
            "run",
            "--config.file",
            str(tmp / "specwatch.yml"),
            "--web.listen-address",
            f"127.0.0.1:{daemon_port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{daemon_port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(base + "/-/ready", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        time.sleep(3 * interval)  # GPM needs two samples; windows need two scrapes
        cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(args.cycles * interval)
        cpu1, t1 = cpu_seconds(daemon.pid), time.monotonic()
        metrics = get(base + "/metrics")
        (out / "daemon_metrics.prom").write_text(metrics)
        print(
            f"# daemon: {args.cycles} cycles of {interval:g}s, CPU {cpu1 - cpu0:.3f} s over {t1 - t0:.1f} s wall "
            f"= {100 * (cpu1 - cpu0) / (t1 - t0):.2f}% of one core, {1000 * (cpu1 - cpu0) / args.cycles:.1f} ms "
            f"CPU per cycle (1 GPU, 1 route, scrapes included)"
        )
        for line in metrics.splitlines():
            if KEEP.match(line):
                print(line)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            log, _ = daemon.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            log, _ = daemon.communicate()
        engine.kill()
        (out / "daemon.log").write_text(log)
        print(f"# daemon exit code on SIGTERM: {daemon.returncode}")
    return 0 if daemon.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
