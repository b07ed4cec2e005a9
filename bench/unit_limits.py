#!/usr/bin/env python3
"""1,000 routes under the shipped unit's own task and file limits: does every cycle complete, is any route up
that was not scraped that cycle, and how many threads and file descriptors does the daemon reach?

    .venv/bin/python bench/unit_limits.py                          # this tree: 1,000 routes, 12 cycles
    .venv/bin/python bench/unit_limits.py --tree /work/main        # and another checkout, side by side
    .venv/bin/python bench/unit_limits.py --routes 300 --cycles 24

The limits come from systemd/specwatch.service: `TasksMax` and `LimitNOFILE`. The daemon runs in a child process
under `prlimit --nproc=TasksMax --nofile=LimitNOFILE`; RLIMIT_NPROC does not hold for root, so as root the
child also runs in a pids cgroup (v1 or v2) with `pids.max` = TasksMax, which is what `TasksMax=` sets.

The engines, outside the limits: `--routes` minus `--hung` simulated vLLM endpoints (bench/soak.py's farm, one
keep-alive connection per route) and `--hung` routes on a server that accepts and never answers. The child runs
`Daemon.tick()` every `--interval` seconds on the real clock (real sources, real HTTP; detectors off unless
`--evaluators`, so the figure is the scrape path's) and, after each cycle, checks every route of the published
Snapshot: up only if its last successful scrape is this cycle's. A thread samples the process's threads
(/proc/self/status) and open fds every 20 ms. Printed per tree: cycles completed of those run, cycles that
raised, routes up, routes falsely up, hung routes up, down routes by reason (route counts are route-cycles),
peak threads and fds against the limits, and the scrape pool's cap. Exit status 0 when this tree completed
every cycle with no route falsely up and its threads stayed under TasksMax.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "specwatch.service"


def unit_limits() -> tuple[int, int]:
    text = UNIT.read_text()
    tasks = re.search(r"^TasksMax=(\d+)\s*$", text, re.M)
    files = re.search(r"^LimitNOFILE=(\d+)\s*$", text, re.M)
    if tasks is None or files is None:
        raise SystemExit("TasksMax= or LimitNOFILE= missing from systemd/specwatch.service")
    return int(tasks.group(1)), int(files.group(1))


# ------------------------------------------------------------------------------------------------ the child
def _status_threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def child(args: argparse.Namespace) -> None:
    if args.tree:
        sys.path.insert(0, str(Path(args.tree).resolve()))
    import specwatch
    from specwatch import daemon as daemon_module
    from specwatch.config import parse_config
    from specwatch.daemon import Daemon

    if not args.evaluators:
        daemon_module.build_route_evaluators = lambda ctx, route: []  # type: ignore[assignment]
    healthy = args.routes - args.hung
    routes = [{"name": f"r{i:02d}", "url": f"{args.farm}/r{i:02d}/metrics"} for i in range(healthy)]
    routes += [{"name": f"hung{i:03d}", "url": args.silent} for i in range(args.hung)]
    config = parse_config(
        {
            "interval": f"{args.interval}s",
            "scrape": {"timeout": f"{args.timeout}s"},
            "gpu": {"enabled": "false"},
            "state_dir": tempfile.mkdtemp(prefix="specwatch-limits-"),
            "routes": [{**r, "engine": "vllm", "gpus": [0]} for r in routes],
        }
    )
    peak = {"threads": 0, "fds": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            try:
                peak["threads"] = max(peak["threads"], _status_threads())
                peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))
            except OSError:  # out of fds for the listing itself: the peak is the limit
                peak["fds"] = max(peak["fds"], args.nofile)

    threading.Thread(target=watch, daemon=True).start()
    d = Daemon(config)
    pool_cap = getattr(d._pool, "max_threads", None)
    result: dict[str, Any] = {
        "specwatch": str(Path(specwatch.__file__).parent),
        "cycles": args.cycles,
        "completed": 0,
        "raised": [],
        "falsely_up": 0,
        "hung_up": 0,
        "up": 0,
        "down": {},
        "pool_cap": pool_cap,
        "late_cycles": 0,
    }
    start = time.monotonic()
    for cycle in range(args.cycles):
        target = start + cycle * args.interval
        time.sleep(max(0.0, target - time.monotonic()))
        now = time.time()
        try:
            d.tick(now)
            result["completed"] += 1
        except BaseException as exc:  # noqa: BLE001 - what the bench measures
            result["raised"].append(f"cycle {cycle}: {type(exc).__name__}: {exc}")
        if time.monotonic() - target > args.interval:
            result["late_cycles"] += 1
        for state in d.snapshot.routes:  # what /metrics serves now
            scraped_now = state.last_scrape_timestamp == now
            if state.up:
                result["up"] += 1
                result["falsely_up"] += not scraped_now
                result["hung_up"] += state.name.startswith("hung")
            else:
                reason = state.error_reason or "?"
                result["down"][reason] = result["down"].get(reason, 0) + 1
    stop.set()
    result.update(peak_threads=peak["threads"], peak_fds=peak["fds"])
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # hung calls are left behind, as `specwatch run` does at exit


# ----------------------------------------------------------------------------------------------- the parent
def _cgroup(tasks_max: int) -> Path | None:
    """A fresh pids cgroup holding at most `tasks_max` tasks (root only), or None."""
    if os.geteuid() != 0:
        return None
    name = f"specwatch-limits-{os.getpid()}-{time.monotonic_ns()}"
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):  # v1's pids hierarchy, else v2's root
        place = root / name
        try:
            place.mkdir()
        except OSError:
            continue
        try:
            (place / "pids.max").write_text(f"{tasks_max}\n")
            return place
        except OSError:  # no pids controller here
            place.rmdir()
    return None


def run_tree(tree: str, args: argparse.Namespace, farm: str, silent: str, tasks: int, nofile: int) -> dict:
    cmd = [
        "prlimit",
        f"--nproc={tasks}",
        f"--nofile={nofile}",
        "--",
        sys.executable,
        str(Path(__file__).resolve()),
        "child",
        "--farm",
        farm,
        "--silent",
        silent,
        "--routes",
        str(args.routes),
        "--hung",
        str(args.hung),
        "--cycles",
        str(args.cycles),
        "--interval",
        str(args.interval),
        "--timeout",
        str(args.timeout),
        "--nofile",
        str(nofile),
    ]
    cmd += ["--tree", tree] if tree else []
    cmd += ["--evaluators"] * args.evaluators
    group = _cgroup(tasks)
    if group is not None:
        cmd = ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh", *cmd]
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", **({"PYTHONPATH": tree} if tree else {})}
    timeout = args.cycles * args.interval + 120
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        code = "timeout"
    finally:
        if group is not None:
            try:
                group.rmdir()
            except OSError:
                pass
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    result = json.loads(line[len("RESULT ") :]) if line else {"completed": 0, "cycles": args.cycles}
    result.update(exit=code, cgroup=group is not None)
    if line is None:
        tail = [x for x in err.splitlines() if x.strip()][-4:]
        result["died"] = " | ".join(tail) or "no output"
    errors = [x for x in err.splitlines() if "Error" in x or "can't start new thread" in x]
    result["stderr_errors"] = len(errors)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    c = sub.add_parser("child", help="internal: the daemon under the limits")
    for p in (parser, c):
        p.add_argument("--routes", type=int, default=1000)
        p.add_argument("--hung", type=int, default=50, help="routes on an engine that accepts and never answers")
        p.add_argument("--cycles", type=int, default=12)
        p.add_argument("--interval", type=float, default=5.0)
        p.add_argument("--timeout", type=float, default=2.0, help="the scrape timeout (the cycle waits 1.5x)")
        p.add_argument("--evaluators", action="store_true", help="run the detectors too")
    parser.add_argument("--tree", action="append", default=[], help="another checkout to run as well (repeatable)")
    c.add_argument("--farm", required=True)
    c.add_argument("--silent", required=True)
    c.add_argument("--tree", default="")
    c.add_argument("--nofile", type=int, default=4096)
    args = parser.parse_args(argv)
    if args.mode == "child":
        child(args)
        return 0

    sys.path.insert(0, str(REPO))
    from specwatch.simulator.hostile import HostileEngines
    from specwatch.simulator.launch import free_port

    tasks, nofile = unit_limits()
    port = free_port()
    farm_proc = subprocess.Popen(  # bench/soak.py's farm; its tracebacks for clients that gave up are noise here
        [sys.executable, str(REPO / "bench" / "soak.py"), "serve-engines"]
        + ["--routes", str(args.routes - args.hung), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert farm_proc.stdout is not None
    if farm_proc.stdout.readline().strip() != "ready":
        raise SystemExit("the simulated engines did not start")
    farm = f"http://127.0.0.1:{port}"
    hostile = HostileEngines(["silent"], healthy=False)
    results: dict[str, dict] = {}
    try:
        for tree in ["", *args.tree]:
            label = tree or "this tree"
            print(f"{label}: {args.routes} routes ({args.hung} hung), {args.cycles} cycles ...", flush=True)
            results[label] = run_tree(tree, args, farm, hostile.url("silent"), tasks, nofile)
    finally:
        hostile.close()
        farm_proc.kill()
        farm_proc.wait()

    print(
        f"\nlimits (systemd/specwatch.service): TasksMax={tasks} LimitNOFILE={nofile}; "
        f"{args.routes} routes, {args.hung} on a silent engine, interval {args.interval:g}s, timeout {args.timeout:g}s"
    )
    header = (
        "tree",
        "cycles ok",
        "raised",
        "up",
        "falsely up",
        "hung up",
        "peak threads",
        "peak fds",
        "pool cap",
        "down",
    )
    print(" | ".join(header))
    for label, r in results.items():
        down = ", ".join(f"{k} {v}" for k, v in sorted(r.get("down", {}).items())) or "-"
        enforced = "cgroup+prlimit" if r.get("cgroup") else "prlimit"
        print(
            " | ".join(
                str(x)
                for x in (
                    f"{label} ({enforced})",
                    f"{r.get('completed', 0)}/{r.get('cycles')}",
                    len(r.get("raised", [])),
                    r.get("up", "-"),
                    r.get("falsely_up", "-"),
                    r.get("hung_up", "-"),
                    f"{r.get('peak_threads', '-')}/{tasks}",
                    f"{r.get('peak_fds', '-')}/{nofile}",
                    r.get("pool_cap", "-"),
                    down,
                )
            )
        )
        for problem in r.get("raised", [])[:3]:
            print(f"    {problem}")
        if "died" in r:
            print(f"    died (exit {r['exit']}): {r['died']}")
    mine = results["this tree"]
    ok = (
        mine.get("completed") == args.cycles
        and not mine.get("raised")
        and mine.get("falsely_up") == 0
        and mine.get("hung_up") == 0
        and mine.get("peak_threads", tasks) < tasks
    )
    print("this tree:", "every cycle completed, no route falsely up, threads under the cap" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
