"""The fleet bump, end to end, on real parts: a rolling model bump across NODES `specwatch run` daemons, one real
Prometheus with the rules `specwatch generate` renders for the site, one real Alertmanager with the example
config it renders, and a webhook receiver in this test recording what is delivered, when, and to whom.

Wall-clock budget: BUDGET_SECONDS (15 minutes) from the first process started to the last assertion, enforced
as a deadline on every wait; a run takes 5-6.5 minutes on a 2-core machine at load 5-30 (figures in
docs/benchmarks.md, "Fleet bump (end to end)"). The tests share one module fixture and run in file order, each step
on the last one's state.

The fleet:
- NODES daemons, each its own instance (127.0.0.1:<port>), state directory and two routes, `chat` and `code`,
  each a SIMULATED vLLM engine (the specwatch simulator; k=4, conditional acceptance 0.7 per position: an
  acceptance rate of 0.443). The 2 x (NODES + 1) engines, the extra two for the node added last, are served by
  one process (tests/engine_farm.py), which also applies each bump when the test says so.
- Every node starts with a learned baseline for the old model on both routes (0.443, φ 2.45), as after a day of
  traffic, written with the product's StateStore before it starts. All share one fleet config, `seed_from`
  (this Prometheus, job="gpu-fleet") included.
- Prometheus scrapes job "gpu-fleet" (file-based discovery, so a node can join) every second and evaluates the
  rules `specwatch generate --settings` renders with selector `job="gpu-fleet"` (not the default), drop alerts
  paging (`severity_drop` and `severity_model_change`: critical).
- Alertmanager runs the example config `specwatch generate` renders with those settings (grouped by route), its
  receivers pointed at this test.

The scenario:
1. Quiet: every node on the old model; nothing pages.
2. A rolling bump, one node after another BUMP_SPACING_SECONDS apart, of all nodes but the last two to
   NEW_MODEL, whose drafts are accepted 20% less often on `chat`; `code` keeps its acceptance.
3. Half-way through, the drafter of the last node (not bumped) breaks on `code`: acceptance x0.5.
4. `specwatch fleet accept --model NEW_MODEL --prometheus ... --selector 'job="gpu-fleet"'`, in dry runs until
   every bumped node has evidence for the new model (three closed evidence blocks, for φ), then for real: the
   bumped nodes adopt on both routes, the two on the old model refuse and keep their baselines (exit 1), and
   the `chat` alerts resolve; again on the bumped nodes alone (`--targets`), everything is "already" (exit 0).
5. A node added afterwards, already on NEW_MODEL, seeds its baselines from the fleet through Prometheus and
   pages nothing for as long as a degraded fresh node takes to page (tests/test_fleet_e2e.py).

What is not the production path, and why: alert `for:` is 5 s (`with_all_for`), Prometheus scrapes and evaluates
every second, Alertmanager groups with group_wait 5s / group_interval 10s (production 30s / 5m), the daemons
evaluate every 2 s with short guards (`min_duration`, `confirm_window`) and weigh evidence in 15 s blocks
(`detection.block`, as tests/test_real_vllm_alerting.py; production 1 minute: these routes are busy, each block
holds thousands of drafted tokens); detectors, rules and routing tree are the production ones. The simulators
run at a quarter of real time (TIME_SCALE).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerting_stack import (
    Processes,
    Webhook,
    alertmanager_config,
    answers,
    binaries,
    free_port,
    free_ports,
    generate_site,
    query,
    query_range,
    start_alertmanager,
    start_prometheus,
    wait_until,
)
from specwatch.mixin.settings import DEFAULT
from specwatch.state.baselines import Baseline, BaselineKey
from specwatch.state.store import StateStore

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
BUDGET_SECONDS = 900.0
NODES = 12
UNBUMPED = 2  # the last two nodes stay on the old model
BROKEN = NODES - 1  # its drafter breaks on `code` (it is not bumped: one cause per page)
JOB = "gpu-fleet"
SELECTOR = f'job="{JOB}"'
OLD_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NEW_MODEL = "meta-llama/Llama-3.1-8B-Instruct-2512"
CHAT_FACTOR = 0.8  # the new model's drafts on chat are accepted 20% less often
BROKEN_FACTOR = 0.5
BUMP_SPACING_SECONDS = 5.0
QUIET_SECONDS = 20.0
# From a bump to its page: up to two evidence blocks, the guards, `for:`, Alertmanager's group_wait
# and group_interval, with slack for a loaded machine (test_e2e_alerting.py allows 140 s for a drop of 30%).
PAGE_DEADLINE_SECONDS = 180.0
RESOLVE_DEADLINE_SECONDS = 90.0
# An accept adopts only with evidence: three closed blocks of the new model's traffic for a φ estimate, so the
# last bumped node is ready a little over three blocks after its bump.
EVIDENCE_DEADLINE_SECONDS = 300.0
# A fresh node with a degraded drafter pages within 140 s of its start (tests/test_fleet_e2e.py); the node added
# last is watched that long.
LATE_NODE_WATCH_SECONDS = 140.0
BLOCK_SECONDS = 15.0  # `detection.block`: the stored baselines' φ is on blocks of this length too
BASELINE = {"acceptance_ratio": 0.443, "overdispersion": 2.45}  # k=4 at 0.7 per position; φ of that profile
ROUTES = ("chat", "code")
DROP_ALERTS = "SpecwatchAcceptanceDegraded|SpecwatchAcceptanceDegradedAfterModelChange"
# The daemons evaluate every 2 s (the e2e tests of one node use 1 s): 13 of them share a loaded 2-core machine.
INTERVAL_SECONDS = 2.0
# The simulated engines run at a quarter of real time, still drafting ~1,700 tokens a second each: 26 of them in
# one process at full speed would starve their own HTTP answers on such a machine.
TIME_SCALE = 0.25
AM_TIMING = {"group_wait": "5s", "group_interval": "10s", "repeat_interval": "1h"}


def _node_name(i: int) -> str:
    return f"node{i:02d}"


class Fleet:
    """Everything the steps share: the processes, the engines, the nodes, and what happened when."""

    def __init__(self, workdir: Path, procs: Processes, webhook: Webhook) -> None:
        self.workdir, self.procs, self.webhook = workdir, procs, webhook
        self.started, self.started_wall = time.monotonic(), time.time()
        self.deadline = self.started + BUDGET_SECONDS
        self.prometheus = self.alertmanager = ""
        self.farm: subprocess.Popen | None = None
        self.engines: dict[str, str] = {}  # "node03-chat" -> base URL
        self.version = ""
        self.instances: dict[int, str] = {}  # node index -> host:port
        self.bumped_at: dict[int, float] = {}  # node index -> wall time (time.time()) of its bump
        self.broken_at = 0.0
        self.accepted_at = 0.0
        self.figures: dict[str, Any] = {}

    # ------------------------------------------------------------------ waiting
    def wait(self, what: str, predicate: Any, timeout: float) -> Any:
        return wait_until(what, predicate, min(timeout, self.deadline - time.monotonic()), self.procs)

    # ------------------------------------------------------------------ the engines
    def event(self, engine: str, event: dict[str, Any]) -> None:
        """Apply a scenario event to one simulated engine now, and wait for the farm to say it did."""
        assert self.farm is not None and self.farm.stdin is not None
        log = self.procs.log_of("engine-farm")
        done = len(_farm_answers(log))
        self.farm.stdin.write((json.dumps({"engine": engine, "event": event}) + "\n").encode())
        self.farm.stdin.flush()
        answer = self.wait(f"the farm to apply {event} to {engine}", lambda: _farm_answers(log)[done:], 30)[0]
        assert answer == {"engine": engine, "applied": event["type"]}, answer

    def bump(self, i: int) -> None:
        """Node i's deploy: both its engines restart on NEW_MODEL; only `chat` drafts worse."""
        self.bumped_at[i] = time.time()
        for route, factor in (("chat", CHAT_FACTOR), ("code", 1.0)):
            bump = {"type": "model_bump", "model_name": NEW_MODEL, "acceptance_factor": factor}
            self.event(f"{_node_name(i)}-{route}", bump)

    # ------------------------------------------------------------------ the nodes
    def start_node(self, i: int, port: int) -> None:
        name = _node_name(i)
        state_dir = self.workdir / name / "state"
        state_dir.mkdir(parents=True)
        if i < NODES:  # the node added last is a fresh one: no state
            _store_old_baselines(state_dir, self.version)
        config = {
            "interval": f"{INTERVAL_SECONDS:g}s",
            "state_dir": str(state_dir),
            "scrape": {"timeout": "1.5s"},
            "gpu": {"enabled": "false"},
            # Short guards so the test runs in minutes; the logic is the production detector's.
            "detection": {
                "min_drafted_tokens": 1000,
                "min_duration": "5s",
                "confirm_window": "10s",
                "block": f"{BLOCK_SECONDS:g}s",
                "seed_from": {"prometheus": self.prometheus, "query_selector": SELECTOR, "min_nodes": 3},
            },
            "routes": [{"name": r, "url": f"{self.engines[f'{name}-{r}']}/metrics"} for r in ROUTES],
        }
        path = self.workdir / name / "specwatch.yml"
        path.write_text(yaml.safe_dump(config))
        self.instances[i] = f"127.0.0.1:{port}"
        self.procs.start(
            name,
            [sys.executable, "-m", "specwatch", "run", "--config.file", str(path)]
            + ["--web.listen-address", self.instances[i], "--web.enable-admin-api"],
        )

    def scrape_targets(self) -> None:
        """Prometheus's file-based discovery: every node started so far (it rereads the file on change), once
        each answers, as a deploy adds a node to discovery once it is ready (else: SpecwatchTargetDown)."""
        for i, instance in self.instances.items():
            self.wait(f"{_node_name(i)} to serve /metrics", lambda u=f"http://{instance}/metrics": answers(u), 120)
        targets = self.workdir / "targets.json"
        tmp = targets.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [self.instances[i] for i in sorted(self.instances)]}]))
        tmp.replace(targets)  # atomic: Prometheus never reads half a file

    def node_of(self, instance: str) -> int:
        return next(i for i, inst in self.instances.items() if inst == instance)

    def baselines(self, i: int) -> list[dict[str, Any]]:
        """The node's stored baselines, from its own API (GET /api/v1/baselines)."""
        with urllib.request.urlopen(f"http://{self.instances[i]}/api/v1/baselines", timeout=10) as response:
            return json.load(response)["baselines"]

    # ------------------------------------------------------------------ what Alertmanager delivered
    def deliveries(self) -> list[dict[str, Any]]:
        """Every notification: arrival (seconds since the bump of node 0), receiver path, group and alerts."""
        with self.webhook.lock:
            notifications = list(self.webhook.notifications)
        first_bump = _monotonic_of(min(self.bumped_at.values())) if self.bumped_at else self.started
        return [
            {
                "at": round(t - first_bump, 1),
                "path": path,
                "receiver": body["receiver"],
                "group_key": body["groupKey"],
                "group_labels": body["groupLabels"],
                "status": body["status"],
                "alerts": sorted(
                    (
                        a["labels"]["alertname"],
                        a["labels"].get("instance", ""),
                        a["labels"].get("route", ""),
                        a["status"],
                    )
                    for a in body["alerts"]
                ),
                "monotonic": t,
                "body": body,
            }
            for t, path, body in notifications
        ]

    def pages(self, route: str) -> list[dict[str, Any]]:
        return [d for d in self.deliveries() if d["path"] == "/page" and d["group_labels"].get("route") == route]

    def firing_instances(self, delivery: dict[str, Any]) -> set[str]:
        return {inst for _, inst, _, status in delivery["alerts"] if status == "firing"}


def _describe(alerts: list[tuple[str, str, str, str]], names: dict[str, str]) -> str:
    """ "AlertName firing on node00 node03; ..." for one notification's (alertname, instance, route, status)."""
    nodes: dict[tuple[str, str], list[str]] = {}
    for name, instance, _, status in alerts:
        nodes.setdefault((name, status), []).append(names.get(instance, instance))
    return "; ".join(f"{name} {status} on {' '.join(sorted(n))}" for (name, status), n in sorted(nodes.items()))


def _runs(timestamps: list[float], step: float = 1.0) -> int:
    """How many unbroken runs a range query's 1-second samples make (a gap: the series was absent)."""
    return sum(1 for a, b in zip([float("-inf"), *timestamps], timestamps) if b - a > 1.5 * step)


def _monotonic_of(wall: float) -> float:
    return time.monotonic() - (time.time() - wall)


def _farm_answers(log: Path) -> list[dict[str, Any]]:
    """The farm's JSON answers to commands (its first JSON line is its engines' URLs)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines[1:]]


def _store_old_baselines(state_dir: Path, version: str) -> None:
    """What a day on the old model leaves in a node's state file: a learned, pinned baseline per route."""
    now = time.time()
    store = StateStore.in_state_dir(str(state_dir))
    try:
        for route in ROUTES:
            assert store.put(
                Baseline(
                    route=route,
                    key=BaselineKey(OLD_MODEL, version, 4),
                    acceptance_ratio=BASELINE["acceptance_ratio"],
                    overdispersion=BASELINE["overdispersion"],
                    dispersion_block_seconds=BLOCK_SECONDS,
                    drafted_tokens=5e8,
                    source="learned",
                    pinned=True,
                    created=now - 86400.0,
                    updated=now - 3600.0,
                )
            )
    finally:
        store.close()


def _site_settings() -> dict[str, Any]:
    """The site's `specwatch generate --settings`: its own selector, drops paging, every `for:` 5s."""
    shortened = {f.name: "5s" for f in dataclasses.fields(DEFAULT) if f.name.endswith("_for")}
    return {
        **shortened,
        "selector": SELECTOR,
        "severity_drop": "critical",
        "severity_model_change": "critical",
        "evaluation_interval_seconds": INTERVAL_SECONDS,
    }


def _prometheus_config(workdir: Path, rules: Path, alertmanager_port: int) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": [
            {
                "job_name": JOB,
                "file_sd_configs": [{"files": [str(workdir / "targets.json")], "refresh_interval": "5s"}],
            }
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _farm_spec(workdir: Path) -> Path:
    """Two engines per node, plus two for the node added last; each is `specwatch simulate` with these args."""
    scenario = workdir / "engine.yaml"
    scenario.write_text(
        yaml.safe_dump({"model_name": OLD_MODEL, "speculation": {"k": 4, "acceptance": 0.7}, "load": 16})
    )
    farm = {
        f"{_node_name(i)}-{route}": ["--engine", "vllm", "--time-scale", str(TIME_SCALE), "--seed", str(10 * i + r)]
        + ["--scenario", str(scenario)]
        for i in range(NODES + 1)
        for r, route in enumerate(ROUTES)
    }
    path = workdir / "farm.json"
    path.write_text(json.dumps(farm))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet-bump")
    binaries()  # skips here when Prometheus or Alertmanager cannot be had
    webhook, procs = Webhook(), Processes(workdir)
    f = Fleet(workdir, procs, webhook)
    try:
        ports = free_ports("prometheus", "alertmanager", *(_node_name(i) for i in range(NODES)))
        rules, example = generate_site(workdir, _site_settings())
        f.alertmanager = start_alertmanager(
            procs, workdir, alertmanager_config(workdir, webhook, example, AM_TIMING), ports["alertmanager"]
        )
        (workdir / "targets.json").write_text("[]")
        f.prometheus = start_prometheus(
            procs, workdir, _prometheus_config(workdir, rules, ports["alertmanager"]), ports["prometheus"]
        )

        f.farm = procs.start(
            "engine-farm",
            [sys.executable, str(REPO / "tests" / "engine_farm.py"), str(_farm_spec(workdir))],
            stdin=True,
        )
        log = procs.log_of("engine-farm")
        first = f.wait(
            "the simulated engines",
            lambda: [line for line in log.read_text().splitlines() if line.startswith("{")],
            120,
        )[0]
        f.engines = json.loads(first)
        with urllib.request.urlopen(f.engines["node00-chat"] + "/version", timeout=10) as response:
            f.version = json.load(response)["version"]
        assert f.version.endswith("-simulated")

        f.wait("Prometheus", lambda: answers(f.prometheus + "/-/ready"), 60)
        for i in range(NODES):
            f.start_node(i, ports[_node_name(i)])
        f.scrape_targets()
        # Every node up, scraped, and judging both routes against its stored old-model baseline.
        judged = f'specwatch_route_acceptance_baseline_info{{{SELECTOR},model_name="{OLD_MODEL}",source="learned"}}'
        try:
            f.wait(
                f"Prometheus to scrape {NODES} nodes, each with the old model's baseline on both routes",
                lambda: len(query(f.prometheus, judged)) == NODES * len(ROUTES),
                240,
            )
        except AssertionError as exc:
            have = sorted((s["metric"]["instance"], s["metric"]["route"]) for s in query(f.prometheus, judged))
            up = query(f.prometheus, f"up{{{SELECTOR}}}")
            raise AssertionError(f"baselines seen: {have}\nup: {up}\n{exc}") from None
        f.figures["startup_seconds"] = round(time.monotonic() - f.started, 1)
        yield f
    finally:
        procs.stop_all()
        webhook.close()
        f.figures["wall_seconds"] = round(time.monotonic() - f.started, 1)
        names = {inst: _node_name(i) for i, inst in f.instances.items()}
        log = [
            f"{d['at']:+7.1f}s {d['receiver']} {json.dumps(d['group_labels'], sort_keys=True)} {d['status']}: "
            + _describe(d["alerts"], names)
            for d in f.deliveries()
        ]
        print(
            "\nfleet bump figures:\n"
            + json.dumps(f.figures, indent=1)
            + "\ndeliveries (seconds since the first bump):\n"
            + "\n".join(log)
        )


def test_a_quiet_fleet_pages_nothing(fleet: Fleet) -> None:
    time.sleep(QUIET_SECONDS)
    fleet.procs.check_alive()
    assert [d for d in fleet.deliveries() if d["path"] == "/page"] == []
    # Not even pending: no route's acceptance is in doubt. (A ticket about the box itself, a stale daemon on a
    # starved machine, is no part of this; the delivery log printed at the end lists any.)
    assert query(fleet.prometheus, f'ALERTS{{{SELECTOR},alertname=~"{DROP_ALERTS}"}}') == []


def test_the_rolling_bump_pages_one_group_naming_every_bumped_node(fleet: Fleet) -> None:
    bumped = list(range(NODES - UNBUMPED))
    for n, i in enumerate(bumped):
        if n == len(bumped) // 2:
            fleet.broken_at = time.time()
            fleet.event(f"{_node_name(BROKEN)}-code", {"type": "acceptance", "factor": BROKEN_FACTOR})
        fleet.bump(i)
        time.sleep(BUMP_SPACING_SECONDS)
    last_bump = max(fleet.bumped_at.values())
    want = {fleet.instances[i] for i in bumped}

    def complete() -> list[dict[str, Any]]:
        return [d for d in fleet.pages("chat") if want <= fleet.firing_instances(d)]

    complete_at = fleet.wait(
        "one chat notification naming every bumped node", complete, last_bump + PAGE_DEADLINE_SECONDS - time.time()
    )[0]["monotonic"]
    fleet.figures["nodes"] = NODES
    fleet.figures["bumped_nodes"] = len(bumped)
    fleet.figures["rollout_seconds"] = round(last_bump - min(fleet.bumped_at.values()), 1)
    fleet.figures["last_bump_to_grouped_notification_seconds"] = round(complete_at - _monotonic_of(last_bump), 1)

    pages = [d for d in fleet.pages("chat") if d["monotonic"] <= complete_at]
    assert {d["receiver"] for d in pages} == {DEFAULT.page_receiver}
    assert {d["group_key"] for d in pages} == {pages[0]["group_key"]}, "more than one notification group for chat"
    assert all(d["group_labels"] == {"route": "chat"} for d in pages)
    fleet.figures["chat_notifications_until_complete"] = len(pages)
    # Every bumped node's alert says what changed: the new model, after a model change.
    alerts = [a for a in pages[-1]["body"]["alerts"] if a["status"] == "firing"]
    assert {a["labels"]["instance"] for a in alerts} == want, "a node not bumped is in the chat group"
    for a in alerts:
        assert a["labels"]["alertname"] == "SpecwatchAcceptanceDegradedAfterModelChange", a["labels"]
        assert a["labels"]["model_name"] == NEW_MODEL, a["labels"]
        assert a["labels"]["severity"] == "critical"


def test_no_node_alerts_before_its_own_bump(fleet: Fleet) -> None:
    """Prometheus's own record of every chat drop alert, pending or firing, against each node's bump time."""
    chat = f'ALERTS{{{SELECTOR},route="chat",alertname=~"{DROP_ALERTS}"}}'
    series = query_range(fleet.prometheus, chat, fleet.started_wall, time.time(), 1.0)
    first: dict[str, float] = {}
    for s in series:
        inst = s["metric"]["instance"]
        first[inst] = min(first.get(inst, float("inf")), float(s["values"][0][0]))
    early = {inst: t for inst, t in first.items() if t <= fleet.bumped_at.get(fleet.node_of(inst), float("inf"))}
    assert not early, f"chat alerts before their node's bump (or on a node never bumped): {early}"
    assert set(first) == {fleet.instances[i] for i in fleet.bumped_at}
    fleet.figures["bump_to_first_alert_seconds"] = {
        "min": round(min(first[fleet.instances[i]] - t for i, t in fleet.bumped_at.items()), 1),
        "max": round(max(first[fleet.instances[i]] - t for i, t in fleet.bumped_at.items()), 1),
    }


def test_the_broken_drafter_pages_for_its_node_alone(fleet: Fleet) -> None:
    broken = fleet.instances[BROKEN]
    pages = fleet.wait(
        "the broken drafter on code to be paged",
        lambda: [d for d in fleet.pages("code") if broken in fleet.firing_instances(d)],
        fleet.broken_at + PAGE_DEADLINE_SECONDS - time.time(),
    )
    fleet.figures["broken_drafter_to_page_seconds"] = round(pages[0]["monotonic"] - _monotonic_of(fleet.broken_at), 1)
    code_pages = fleet.pages("code")
    assert {d["group_key"] for d in code_pages} == {code_pages[0]["group_key"]}
    assert {inst for d in code_pages for _, inst, _, _ in d["alerts"]} == {broken}
    assert {name for d in code_pages for name, _, _, _ in d["alerts"]} == {"SpecwatchAcceptanceDegraded"}
    # Nothing else pages: only the chat and code groups reach the pager.
    assert {json.dumps(d["group_labels"]) for d in fleet.deliveries() if d["path"] == "/page"} == {
        '{"route": "chat"}',
        '{"route": "code"}',
    }


def _fleet_accept(*args: str) -> tuple[subprocess.CompletedProcess, dict[tuple[str, str], str]]:
    """`specwatch fleet accept --model NEW_MODEL ARGS`, and its table as {(node, route): outcome}."""
    done = subprocess.run(
        [sys.executable, "-m", "specwatch", "fleet", "accept", "--model", NEW_MODEL, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    outcomes = {}
    for line in done.stdout.splitlines():
        fields = [field.strip() for field in line.split("│")]
        if len(fields) >= 3 and fields[0].startswith("127.0.0.1:"):
            outcomes[(fields[0], fields[1])] = fields[2]
    return done, outcomes


def test_the_fleet_accept_adopts_where_bumped_refuses_elsewhere_and_resolves(fleet: Fleet) -> None:
    bumped = sorted(fleet.bumped_at)
    old = [i for i in range(NODES) if i not in fleet.bumped_at]
    from_prometheus = ("--prometheus", fleet.prometheus, "--selector", SELECTOR)
    before = {i: fleet.baselines(i) for i in range(NODES)}

    def expect(outcome_if_bumped: str) -> dict[tuple[str, str], str]:
        return {
            (fleet.instances[i], route): outcome_if_bumped if i in fleet.bumped_at else "refused"
            for i in range(NODES)
            for route in ROUTES
        }

    # The operator's gate: dry runs until every bumped node has evidence for the new model, three closed
    # blocks of its traffic for a φ estimate (until then it would refuse, saying so).
    dry_runs: list[subprocess.CompletedProcess] = []

    def ready() -> bool:
        dry, outcomes = _fleet_accept(*from_prometheus, "--dry-run")
        dry_runs.append(dry)
        assert dry.returncode == 1, dry.stdout + dry.stderr  # the nodes on the old model would refuse
        if outcomes == expect("would_adopt"):
            return True
        time.sleep(5)  # a dry run costs a second or two of CPU
        return False

    last_bump = max(fleet.bumped_at.values())
    try:
        fleet.wait(
            "every bumped node to have evidence for the new model",
            ready,
            last_bump + EVIDENCE_DEADLINE_SECONDS - time.time(),
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe last dry run:\n{dry_runs[-1].stdout}") from None
    fleet.figures["last_bump_to_evidence_everywhere_seconds"] = round(time.time() - last_bump, 1)
    fleet.figures["dry_runs"] = len(dry_runs)
    assert {i: fleet.baselines(i) for i in range(NODES)} == before, "a dry run changed a baseline"

    fleet.accepted_at = time.time()
    run, outcomes = _fleet_accept(*from_prometheus)
    fleet.figures["fleet_accept_seconds"] = round(time.time() - fleet.accepted_at, 1)
    fleet.figures["fleet_accept_summary"] = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 1, run.stdout + run.stderr  # the nodes on the old model refuse
    assert outcomes == expect("adopted"), run.stdout
    for i in old:
        assert fleet.baselines(i) == before[i], f"{_node_name(i)} (old model) lost or changed a baseline"
    for i in bumped:
        adopted = {b["route"]: b for b in fleet.baselines(i) if b["model"] == NEW_MODEL}
        assert set(adopted) == set(ROUTES), f"{_node_name(i)} did not adopt {NEW_MODEL} on every route: {adopted}"
        assert adopted["chat"]["acceptance_ratio"] == pytest.approx(
            BASELINE["acceptance_ratio"] * CHAT_FACTOR, rel=0.05
        )
        assert adopted["code"]["acceptance_ratio"] == pytest.approx(BASELINE["acceptance_ratio"], rel=0.05)
        # The old model's baselines stay, for a rollback.
        assert {b["route"] for b in fleet.baselines(i) if b["model"] == OLD_MODEL} == set(ROUTES)

    # Every chat alert resolves: the group's notifications after the accept end "resolved", and between them they
    # name every bumped node's alert resolved (in one, or in two where the nodes' verdicts cleared on either side
    # of a group_interval).
    since = _monotonic_of(fleet.accepted_at)

    def after_accept() -> list[dict[str, Any]]:
        return [d for d in fleet.pages("chat") if d["monotonic"] > since]

    resolved = fleet.wait(
        "the chat alerts to resolve after the accept",
        lambda: [d for d in after_accept()[-1:] if d["status"] == "resolved"],
        RESOLVE_DEADLINE_SECONDS,
    )[0]
    fleet.figures["accept_to_resolved_seconds"] = round(resolved["monotonic"] - since, 1)
    fleet.figures["chat_notifications_after_accept"] = len(after_accept())
    assert {inst for d in after_accept() for _, inst, _, status in d["alerts"] if status == "resolved"} == {
        fleet.instances[i] for i in bumped
    }
    assert {d["group_key"] for d in fleet.pages("chat")} == {resolved["group_key"]}
    # The broken drafter's node refused (it runs the old model): its page stands.
    assert [d["status"] for d in fleet.pages("code")][-1] == "firing"

    # Idempotent: on the bumped nodes alone it has nothing left to do, and says so with exit 0.
    targets = fleet.workdir / "bumped-targets.txt"
    targets.write_text("".join(f"{fleet.instances[i]}\n" for i in bumped))
    again, outcomes = _fleet_accept("--targets", str(targets))
    assert again.returncode == 0, again.stdout + again.stderr
    assert set(outcomes.values()) == {"already"}, again.stdout


def test_a_node_added_afterwards_seeds_from_the_fleet_and_pages_nothing(fleet: Fleet) -> None:
    late = NODES
    fleet.bump(late)  # provisioned with the new model: its engines serve it before its daemon starts
    started = time.time()
    fleet.start_node(late, free_port())
    fleet.scrape_targets()
    inst = fleet.instances[late]

    def seeded() -> list[dict]:
        return query(
            fleet.prometheus,
            f'specwatch_route_acceptance_baseline_info{{{SELECTOR},instance="{inst}",model_name="{NEW_MODEL}",source="fleet"}}',
        )

    fleet.wait("the node added last to seed both routes from the fleet", lambda: len(seeded()) == len(ROUTES), 120)
    fleet.figures["late_node_start_to_seeded_seconds"] = round(time.time() - started, 1)
    ratios = {
        s["metric"]["route"]: float(s["value"][1])
        for s in query(fleet.prometheus, f'specwatch_route_acceptance_baseline_ratio{{{SELECTOR},instance="{inst}"}}')
    }
    adopted = [
        b["acceptance_ratio"]
        for i in fleet.bumped_at
        if i != late
        for b in fleet.baselines(i)
        if b["route"] == "chat" and b["model"] == NEW_MODEL
    ]
    assert ratios["chat"] == pytest.approx(statistics.median(adopted), rel=0.02)

    while time.time() < started + LATE_NODE_WATCH_SECONDS:
        fleet.procs.check_alive()
        time.sleep(2)
    assert query_range(fleet.prometheus, f'ALERTS{{{SELECTOR},instance="{inst}"}}', started, time.time(), 1.0) == []
    assert not [d for d in fleet.deliveries() if any(a[1] == inst for a in d["alerts"])]
    verdict = query(fleet.prometheus, f'specwatch_route_acceptance_degraded{{{SELECTOR},instance="{inst}"}}')
    assert sorted(float(v["value"][1]) for v in verdict) == [0.0, 0.0], verdict


def test_figures(fleet: Fleet) -> None:
    """What was delivered, by receiver, group and status (printed with the other figures at the end)."""
    counts: dict[str, int] = {}
    for d in fleet.deliveries():
        key = f"{d['receiver']} {json.dumps(d['group_labels'], sort_keys=True)} {d['status']}"
        counts[key] = counts.get(key, 0) + 1
    fleet.figures["notifications"] = counts
    # Scrapes that failed (a loaded box) and alerts that stopped firing and fired again, from Prometheus.
    now, names = time.time(), {inst: _node_name(i) for i, inst in fleet.instances.items()}
    failed = query_range(fleet.prometheus, f"up{{{SELECTOR}}} == 0", fleet.started_wall, now, 1.0)
    fleet.figures["failed_scrapes"] = {names[s["metric"]["instance"]]: len(s["values"]) for s in failed}
    firing = query_range(
        fleet.prometheus,
        f'ALERTS{{{SELECTOR},alertstate="firing",alertname=~"{DROP_ALERTS}"}}',
        fleet.started_wall,
        now,
    )
    fleet.figures["drop_alerts_firing_more_than_once"] = {
        f"{names[s['metric']['instance']]} {s['metric']['route']}": _runs([float(t) for t, _ in s["values"]])
        for s in firing
        if _runs([float(t) for t, _ in s["values"]]) > 1
    }
    fleet.figures["test_seconds_so_far"] = round(time.monotonic() - fleet.started, 1)
    assert time.monotonic() < fleet.deadline
