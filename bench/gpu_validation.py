#!/usr/bin/env python3
"""Validate the NVML/GPM source on a real GPU: idle, decode-like and compute-bound load, and sampling cost.

Run on the GPU machine from the repository root (needs torch, nvidia-ml-py, prometheus-client and PyYAML;
nothing else of specwatch's dependencies):

    PYTHONPATH=. python3 bench/gpu_validation.py --out gpu_validation.txt

Each load runs in a child process that also listens on a TCP port, so the route -> GPU auto-mapping is
checked against a real GPU process. The loads:
  decode   y = x @ W with x of 8 rows and W cycling through 2 GiB of bf16 weights: matrix-vector-like,
           bound by DRAM bandwidth like a decode step at small batch;
  compute  8192 x 8192 x 8192 bf16 matrix products: bound by the tensor cores.
Output: the exported metric lines per phase, per-interval GPM readings, nvidia-smi's view for comparison,
and the CPU cost of one sampling cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

GPM_KEYS = (
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_dram_bandwidth_utilization_ratio",
    "gpu_sm_occupancy_ratio",
)


# --------------------------------------------------------------------------- the load (child process)
def run_load(kind: str, seconds: float) -> None:
    import torch

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    dev = torch.device("cuda:0")
    if kind == "decode":
        weights = [torch.randn(8192, 32768, device=dev, dtype=torch.bfloat16) for _ in range(4)]  # 4 x 512 MiB
        x = torch.randn(8, 8192, device=dev, dtype=torch.bfloat16)

        def step() -> None:
            for w in weights:
                torch.matmul(x, w)
    else:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

        def step() -> None:
            torch.matmul(a, b)

    step()
    torch.cuda.synchronize()
    print(json.dumps({"port": listener.getsockname()[1], "pid": os.getpid()}), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            step()
        torch.cuda.synchronize()  # keep the launch queue short so the load stops on time


class Load:
    def __init__(self, kind: str, seconds: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--load", kind, "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for line in self.proc.stdout:
            if line.startswith("{"):
                break
        else:
            raise RuntimeError(f"{kind} load did not start (exit {self.proc.wait()})")
        info = json.loads(line)
        self.port, self.pid = info["port"], info["pid"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# --------------------------------------------------------------------------- rendering
def exposition(nvml_up: bool | None, gpus, route_gpus: dict[str, tuple[int, ...]]) -> list[str]:
    """The GPU part of /metrics for these samples, rendered by specwatch's own exporter."""
    from prometheus_client import CollectorRegistry, generate_latest

    from specwatch.export.prometheus import SnapshotCollector
    from specwatch.snapshot import RouteState, Snapshot

    snapshot = Snapshot(
        timestamp=time.time(),
        gpus=tuple(gpus),
        nvml_up=nvml_up,
        routes=tuple(RouteState(name=r, up=True, gpus=g) for r, g in route_gpus.items()),
    )
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot))
    text = generate_latest(registry).decode()
    return [
        line
        for line in text.splitlines()
        if "specwatch_gpu_" in line or "specwatch_nvml_" in line or "specwatch_route_gpu_info" in line
    ]


def nvidia_smi() -> str:
    query = (
        "utilization.gpu,memory.used,memory.total,power.draw,clocks.sm,clocks.mem,temperature.gpu,"
        "clocks_event_reasons.active"
    )
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True, timeout=20
        )
        return (out.stdout or out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


# --------------------------------------------------------------------------- phases
def phase(
    source, name: str, load: Load | None, intervals: int, interval_s: float, report: list[str], results: dict
) -> None:
    from specwatch.config import RouteConfig

    source.sample(time.time())  # primes GPM: values cover the interval that follows
    readings = []
    for _ in range(intervals):
        time.sleep(interval_s)
        nvml_up, gpus = source.sample(time.time())
        readings.append({k: gpus[0].fields.get(k) for k in GPM_KEYS} if gpus else {})
    routes = {}
    mapping_ms = None
    if load is not None:
        route = RouteConfig(name=f"{name}-load", url=f"http://127.0.0.1:{load.port}/metrics")
        t0 = time.perf_counter()
        routes[route.name] = source.route_gpus(route)
        mapping_ms = (time.perf_counter() - t0) * 1e3
    smi = nvidia_smi()
    report += [
        f"## phase: {name}" + (f" (load pid {load.pid}, port {load.port})" if load else ""),
        "",
        f"GPM per {interval_s:g}s interval (GPU 0):",
    ]
    for i, r in enumerate(readings):
        report.append(
            f"  interval {i + 1}: "
            + "  ".join(f"{k[4:]}={v:.3f}" if v is not None else f"{k[4:]}=absent" for k, v in r.items())
        )
    pids = sorted({p for g in gpus for p in g.pids})
    if load is not None:
        report.append(f"route auto-mapping: {routes} in {mapping_ms:.1f} ms; NVML compute pids {pids}")
    report += [
        "",
        "exported metric lines (last interval):",
        *exposition(nvml_up, gpus, routes),
        "",
        "nvidia-smi at the end of the phase:",
        smi,
        "",
    ]
    results[name] = {
        "gpm": readings,
        "fields": [dict(g.fields) for g in gpus],
        "route_gpus": routes,
        "compute_pids": pids,
        "load_pid": load.pid if load else None,
        "mapping_ms": mapping_ms,
    }


def cost(source, cycles: int, label: str, report: list[str], results: dict) -> None:
    """CPU time (process and thread) per sample() cycle; GPM needs some time between samples, so 10 ms gaps."""
    n_gpus = len(source.sample(time.time())[1])
    cpu, wall = [], []
    for _ in range(cycles):
        time.sleep(0.01)
        c0, w0 = time.thread_time(), time.perf_counter()
        source.sample(time.time())
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    cpu_ms = [c * 1e3 for c in cpu]
    wall_ms = [w * 1e3 for w in wall]
    q = statistics.quantiles(cpu_ms, n=100)
    per_gpu = statistics.mean(cpu_ms) / max(n_gpus, 1)
    line = (
        f"{label}: {cycles} cycles, {n_gpus} GPU(s): CPU per cycle mean {statistics.mean(cpu_ms):.3f} ms, "
        f"median {statistics.median(cpu_ms):.3f} ms, p99 {q[98]:.3f} ms; "
        f"wall mean {statistics.mean(wall_ms):.3f} ms; "
        f"per GPU {per_gpu:.3f} ms CPU -> 8 GPUs ~ {8 * per_gpu:.2f} ms (extrapolated, linear in GPUs)"
    )
    report.append(line)
    results[f"cost_{label}"] = {
        "cycles": cycles,
        "gpus": n_gpus,
        "cpu_ms_mean": statistics.mean(cpu_ms),
        "cpu_ms_median": statistics.median(cpu_ms),
        "cpu_ms_p99": q[98],
        "wall_ms_mean": statistics.mean(wall_ms),
        "cpu_ms_per_gpu": per_gpu,
    }


def call_costs(report: list[str], results: dict) -> None:
    """Wall time of each NVML call behind the field table, 2000 calls each (where the breakdown goes)."""
    import pynvml

    from specwatch.sources.gpu_fields import NVML_FIELDS

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen, costs = set(), {}
    calls = [(f.call, f.args) for f in NVML_FIELDS] + [("nvmlDeviceGetComputeRunningProcesses", ())]
    for name, args in calls:
        if (name, args) in seen:
            continue
        seen.add((name, args))
        fn = getattr(pynvml, name)
        resolved = [getattr(pynvml, a) for a in args]
        try:
            fn(h, *resolved)
        except pynvml.NVMLError as exc:
            costs[f"{name}{tuple(args)}"] = f"error: {exc}"
            continue
        t0 = time.thread_time()
        for _ in range(2000):
            fn(h, *resolved)
        costs[f"{name}{tuple(args)}"] = f"{(time.thread_time() - t0) / 2000 * 1e6:.1f} us CPU"
    report.append("per-call CPU cost:")
    report += [f"  {k}: {v}" for k, v in costs.items()]
    results["call_costs"] = costs


def gpm_costs(report: list[str], results: dict) -> None:
    """CPU cost of GPM's two calls on their own, and of the energy counter both ways (where the cycle's time goes)."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    buffers = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 4
    for i, mid in enumerate((2, 3, 5, 10)):
        request.metrics[i].metricId = mid
    out = {}
    try:
        for gap in (0.01, 0.1):
            get, metrics = [], []
            pynvml.nvmlGpmSampleGet(h, buffers[0])
            for i in range(1, 101 if gap < 0.05 else 31):
                time.sleep(gap)
                c0 = time.thread_time()
                pynvml.nvmlGpmSampleGet(h, buffers[i % 2])
                c1 = time.thread_time()
                request.sample1, request.sample2 = buffers[(i - 1) % 2], buffers[i % 2]
                pynvml.nvmlGpmMetricsGet(request)
                get.append((c1 - c0) * 1e3)
                metrics.append((time.thread_time() - c1) * 1e3)
            out[f"nvmlGpmSampleGet, {gap * 1e3:g} ms apart"] = statistics.mean(get)
            out[f"nvmlGpmMetricsGet (4 metrics), {gap * 1e3:g} ms apart"] = statistics.mean(metrics)
    finally:
        for b in buffers:
            pynvml.nvmlGpmSampleFree(b)
    for label, call in (
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h)),
        (
            "nvmlDeviceGetFieldValues([TOTAL_ENERGY])",
            lambda: pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]),
        ),
    ):
        try:
            call()
            c0 = time.thread_time()
            for _ in range(200):
                call()
            out[label] = (time.thread_time() - c0) / 200 * 1e3
        except pynvml.NVMLError as exc:
            out[label] = f"error: {exc}"
    report.append("component CPU cost (ms, mean):")
    report += [f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}" for k, v in out.items()]
    results["component_costs_ms"] = out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", choices=("decode", "compute"), help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=40.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="gpu_validation.txt", help="report file (a .json beside it holds the raw data)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between samples (GPM interval)")
    ap.add_argument("--intervals", type=int, default=4, help="sampled intervals per phase")
    ap.add_argument("--cost-cycles", type=int, default=500)
    args = ap.parse_args()
    if args.load:
        run_load(args.load, args.seconds)
        return 0

    import logging

    from specwatch.config import GpuConfig
    from specwatch.sources.nvml import make_gpu_source

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from importlib.metadata import version

    report = [
        f"# specwatch GPU validation, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        f"python {sys.version.split()[0]}, nvidia-ml-py {version('nvidia-ml-py')}, kernel {os.uname().release}",
        "",
    ]
    results: dict = {}
    source = make_gpu_source(GpuConfig(enabled="true"))
    try:
        phase(source, "idle", None, args.intervals, args.interval, report, results)
        cost(source, args.cost_cycles, "idle", report, results)
        report.append("")
        for kind in ("decode", "compute"):
            load = Load(kind, 600.0)  # stopped when its phase ends
            try:
                time.sleep(1.0)
                phase(source, kind, load, args.intervals, args.interval, report, results)
                if kind == "compute":
                    cost(source, args.cost_cycles, "compute_load", report, results)
                    report.append("")
            finally:
                load.stop()
        call_costs(report, results)
        gpm_costs(report, results)
    finally:
        source.close()
    text = "\n".join(report) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
