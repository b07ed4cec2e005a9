"""`specwatch gate`: catch a model or drafter bump before it ships.

    specwatch gate --url http://staging:8000 --engine vllm --reference prod-ref.json [--junit out.xml]
    specwatch gate record --url http://prod:8000 --engine vllm --out prod-ref.json

`gate` sends the probe set (built-in, or `--prompts FILE`) greedily to a candidate server, reads each prompt's
acceptance as the daemon's canary probes do (probe/runner.py: the engine's per-request fields, else counter
bracketing), and judges the drop against a reference with a confidence interval (probe/gate.py). It prints a
per-prompt table and the verdict, writes `--json` and `--junit` for CI, and exits 0 (pass), 1 (a drop at or
beyond `--drop`, with the evidence to say so) or 2 (inconclusive: too few prompts or tokens read, server
errors, or an interval too wide to decide). The reference is a file `gate record` wrote from a production server
(version it beside the deploy manifest), the fingerprint a node's daemon keeps (`--state.dir`, `--route`), or
the fleet's traffic baseline for the key in Prometheus (`--reference-prometheus`, `--route`: fail or
inconclusive only, never a pass; probe/gate.py judge_against_ratio says why).

With `--plain URL` (the same model served without speculation) a two-point sweep follows the probe round
(offline/sweep.py, speculative vs plain at `--sweep-concurrency`), and a throughput verdict says whether the
candidate still speeds up low-batch traffic; it changes the exit code only with `--require-speedup`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.table import Table

from specwatch.config import Config, ConfigError, SeedFrom, load_http_client_config, parse_config
from specwatch.engine_kinds import ENGINE_KINDS
from specwatch.evaluators.canary import bracket_scraper
from specwatch.evaluators.fleet_seed import SeedError, fleet_baseline
from specwatch.offline.sweep import SweepSettings, load_prompts, run_sweep
from specwatch.probe.gate import (
    MIN_SWEEP_REQUESTS,
    GateVerdict,
    SpeedupPoint,
    SpeedupVerdict,
    combined_exit,
    judge,
    judge_against_ratio,
    judge_speedup,
    speedup_interval,
)
from specwatch.probe.prompts import BUILTIN, PromptSet, PromptSetError, load_prompt_set
from specwatch.probe.responses import Acceptance
from specwatch.probe.runner import ProbeRunner, Round
from specwatch.sources.base import SourceError
from specwatch.sources.engines import make_source
from specwatch.state.baselines import BaselineKey
from specwatch.state.store import StateStore

REFERENCE_FORMAT = "specwatch-gate-reference/1"
_DASH = "–"
SWEEP_CONCURRENCY = (1, 8)


@dataclass(frozen=True)
class FleetReference:
    """The fleet's traffic baseline for a key: the median over the nodes that export one (fleet_seed.py)."""

    prometheus: str
    route: str
    key: BaselineKey
    ratio: float
    nodes: int
    left_out: int


def _levels(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not two comma-separated concurrencies: {text!r}") from None
    if len(values) != 2 or values[0] < 1:
        raise argparse.ArgumentTypeError(f"want two different concurrencies >= 1, e.g. 1,8: {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the server's base URL, e.g. http://staging:8000 (its /metrics is read too)")
    parser.add_argument("--engine", choices=[k for k in ENGINE_KINDS if k != "auto"], help="the server's engine")
    parser.add_argument("--http.config.file", dest="http_config_file", default="", help="auth and TLS for the server")
    parser.add_argument("--prompts", default=BUILTIN, help=f"probe set: {BUILTIN} or a JSON/YAML prompt file")
    parser.add_argument("--max-tokens", dest="max_tokens", type=int, default=None, help="tokens per prompt")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per prompt")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="prompts in flight (default 1); record the reference with the same, as a GPU's greedy output may "
        "vary with the batch; counter bracketing sends one at a time whatever this says",
    )
    parser.add_argument("--reference", default="", help="a reference file written by `specwatch gate record`")
    parser.add_argument("--state.dir", dest="state_dir", default="", help="or: a node's state directory ...")
    parser.add_argument("--route", default="", help="... and the route whose canary fingerprint is the reference")
    fleet = parser.add_argument_group("the fleet's traffic baseline as the reference (fail or inconclusive only)")
    fleet.add_argument(
        "--reference-prometheus",
        dest="reference_prometheus",
        default="",
        metavar="URL",
        help="or: the fleet's baseline for --route and the key in this Prometheus",
    )
    fleet.add_argument("--selector", default="", help='extra label matchers for the fleet\'s series, e.g. job="gpu"')
    fleet.add_argument("--min-nodes", dest="min_nodes", type=int, default=3, help="fewer nodes: no reference (3)")
    fleet.add_argument(
        "--reference-http.config.file",
        dest="reference_http_config_file",
        default="",
        help="auth and TLS for Prometheus",
    )
    fleet.add_argument(
        "--reference-model",
        dest="reference_model",
        default="",
        help="the key's model (default: the candidate's; give production's for a model bump)",
    )
    fleet.add_argument(
        "--reference-engine-version",
        dest="reference_engine_version",
        default=None,
        help="the key's engine version (default: the candidate's)",
    )
    fleet.add_argument(
        "--reference-draft-length",
        dest="reference_draft_length",
        type=int,
        default=None,
        help="the key's draft length k (default: the candidate's)",
    )
    sweep = parser.add_argument_group("throughput: a two-point sweep against the same model without speculation")
    sweep.add_argument("--plain", default="", metavar="URL", help="the same model served without speculation")
    sweep.add_argument(
        "--sweep-concurrency",
        dest="sweep_concurrency",
        type=_levels,
        default=SWEEP_CONCURRENCY,
        metavar="LOW,HIGH",
        help="the two concurrencies (default 1,8); the verdict is at LOW",
    )
    sweep.add_argument(
        "--sweep-max-tokens",
        dest="sweep_max_tokens",
        type=int,
        default=64,
        help="output tokens per sweep request (default 64)",
    )
    sweep.add_argument(
        "--sweep-requests",
        dest="sweep_requests",
        type=int,
        default=8,
        help=f"requests per client and level (default 8; under {MIN_SWEEP_REQUESTS} at LOW: inconclusive)",
    )
    sweep.add_argument(
        "--sweep-prompts",
        dest="sweep_prompts",
        default="",
        metavar="JSONL",
        help="sweep prompts, as `specwatch sweep --prompts` (default: its built-in chat/code/math mix)",
    )
    sweep.add_argument(
        "--sweep-output",
        dest="sweep_output",
        default="",
        metavar="FILE",
        help="keep the sweep's result file (specwatch-crossover/1) here",
    )
    sweep.add_argument(
        "--min-speedup",
        dest="min_speedup",
        type=float,
        default=1.0,
        help="the speedup at LOW that passes: the whole interval at or above it (default 1.0)",
    )
    sweep.add_argument(
        "--require-speedup",
        dest="require_speedup",
        action="store_true",
        help="a throughput fail exits 1 and an inconclusive sweep 2 (default: reported only)",
    )
    parser.add_argument("--drop", type=float, default=0.15, help="the drop that fails the gate (default 0.15)")
    parser.add_argument("--confidence", type=float, default=0.95, help="of the drop's interval (default 0.95)")
    parser.add_argument("--json", dest="json_out", default="", help="write the verdict as JSON here")
    parser.add_argument("--junit", dest="junit_out", default="", help="write JUnit XML here (a test per prompt)")
    actions = parser.add_subparsers(dest="gate_action", metavar="ACTION")
    record = actions.add_parser("record", help="write a reference from a server's probe round")
    record.add_argument("--out", required=True, help="the reference file to write")


def main(args: argparse.Namespace) -> int:
    console = Console()
    try:
        config = _config(args)
        prompt_set = load_prompt_set(args.prompts)
        sweep_prompts = load_prompts(args.sweep_prompts) if args.sweep_prompts else None
    except (ConfigError, PromptSetError, ValueError) as exc:
        print(f"specwatch gate: {exc}", file=sys.stderr)
        return 2
    if args.gate_action == "record" and args.plain:
        print("specwatch gate record: --plain is for the gate, not for recording", file=sys.stderr)
        return 2
    if args.plain and "@" in urlsplit(args.plain).netloc:  # the message leaves the URL out: it holds a secret
        print("specwatch gate: --plain: credentials in the URL are refused; use --http.config.file", file=sys.stderr)
        return 2
    if args.plain and (args.sweep_max_tokens < 2 or args.sweep_requests < 1 or args.min_speedup <= 0):
        print("specwatch gate: --sweep-max-tokens >= 2, --sweep-requests >= 1, --min-speedup > 0", file=sys.stderr)
        return 2
    route = config.routes[0]
    try:
        key = _key(config)
    except SourceError as exc:
        print(f"specwatch gate: cannot read {route.url}: {exc}", file=sys.stderr)
        return 2
    reference: dict[str, Acceptance] | FleetReference = {}
    if args.gate_action != "record":
        try:
            reference = _reference(args, prompt_set, key, config)
        except ValueError as exc:
            print(f"specwatch gate: {exc}", file=sys.stderr)
            return 2
    assert route.probe is not None
    console.print(
        f"{args.url} ({key.label()}): {len(prompt_set.prompts)} prompts of {prompt_set.name} ({prompt_set.hash}), "
        f"max_tokens {route.probe.max_tokens}, greedy"
    )
    runner = ProbeRunner(
        route, route.probe, prompt_set, engine_kind=lambda: args.engine, scrape=bracket_scraper(route, config)
    )
    rnd = runner.run_now(reason="gate")
    if args.gate_action == "record":
        return _record(args, rnd, prompt_set, key, console)
    if rnd.outcome != "ok":
        verdict = GateVerdict("inconclusive", f"probe round {rnd.outcome}: {rnd.message}", args.drop, args.confidence)
    elif isinstance(reference, FleetReference):
        verdict = judge_against_ratio(rnd.read(), reference.ratio, args.drop, args.confidence)
    else:
        verdict = judge(rnd.read(), reference, args.drop, args.confidence)
    console.print(_table(rnd, reference if isinstance(reference, dict) else {}))
    if isinstance(reference, FleetReference):
        console.print(
            f"reference: the fleet's traffic baseline for {reference.key.label()} on route {reference.route}, "
            f"{reference.ratio:.3f} (median of {reference.nodes} nodes in {reference.prometheus}); a traffic mix, "
            "not these prompts: fail or inconclusive only"
        )
    style = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}
    console.print(f"[{style[verdict.verdict]}]{verdict.verdict.upper()}[/]: {verdict.reason}")
    speedup, sweep_doc = None, None
    if args.plain:
        speedup, sweep_doc = _sweep(args, config, sweep_prompts, console)
        gating = "" if speedup.required else " (reported only: --require-speedup gates on it)"
        console.print(f"[{style[speedup.verdict]}]THROUGHPUT {speedup.verdict.upper()}[/]: {speedup.reason}{gating}")
    exit_code = combined_exit(verdict.exit_code, speedup.exit_code if speedup else 0)
    if args.json_out:
        doc = _document(verdict, rnd, key, prompt_set, reference, speedup, sweep_doc, exit_code)
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.junit_out:
        _junit(verdict, rnd, key, speedup).write(args.junit_out, encoding="utf-8", xml_declaration=True)
    return exit_code


def _sweep(
    args: argparse.Namespace, config: Config, prompts: list[dict[str, Any]] | None, console: Console
) -> tuple[SpeedupVerdict, dict[str, Any]]:
    """The two-point sweep, candidate (speculative) against --plain, and its throughput verdict."""
    settings = SweepSettings(
        plain_url=args.plain,
        spec_url=args.url,
        concurrency=args.sweep_concurrency,
        max_tokens=args.sweep_max_tokens,
        requests_per_client=args.sweep_requests,
        timeout_s=args.timeout or 120.0,
        http=config.routes[0].http,
        note="specwatch gate: two-point sweep",
        **({"prompts": prompts, "prompts_source": args.sweep_prompts} if prompts else {}),
    )
    console.print(f"sweep: {args.url} against {args.plain} (plain) at concurrency {args.sweep_concurrency}")
    with tempfile.TemporaryDirectory(prefix="specwatch-gate-") as tmp:
        outcome = run_sweep(settings, args.sweep_output or Path(tmp) / "sweep.json")
    doc = outcome.document
    points = [_point(level, args.confidence) for level in doc["levels"]]
    for level, point in zip(doc["levels"], points):
        interval = f" ({point.low:.2f}x to {point.high:.2f}x)" if point.low is not None and point.high else ""
        console.print(
            f"  concurrency {level['concurrency']:>4}: plain {level['plain']['output_tokens_per_s']:8.1f} tok/s, "
            f"speculative {level['spec']['output_tokens_per_s']:8.1f} tok/s, speedup {level['speedup'] or 0:.3f}x"
            + interval
        )
    return judge_speedup(points, args.min_speedup, args.require_speedup, failure=outcome.failure), doc


def _point(level: dict[str, Any], confidence: float) -> SpeedupPoint:
    """A sweep level's speedup with its interval from both servers' per-request latencies (speedup_interval)."""
    speedup = level.get("speedup")
    plain, spec = level["plain"], level["spec"]
    keys = ("latency_per_token_mean_s", "latency_per_token_sd_s", "latency_per_token_n")
    if not speedup or any(side.get(key) is None for side in (plain, spec) for key in keys):
        return SpeedupPoint(int(level["concurrency"]), speedup)
    interval = speedup_interval(
        float(speedup),
        (float(plain[keys[0]]), float(plain[keys[1]]), int(plain[keys[2]])),
        (float(spec[keys[0]]), float(spec[keys[1]]), int(spec[keys[2]])),
        confidence,
    )
    low, high = interval if interval is not None else (None, None)
    return SpeedupPoint(int(level["concurrency"]), float(speedup), low, high)


def _config(args: argparse.Namespace) -> Config:
    """A one-route config for the candidate, validated as the daemon's own (auth, TLS, probe settings)."""
    if not args.url or not args.engine:
        raise ConfigError(["--url and --engine are required"])
    probe: dict[str, Any] = {"prompts": args.prompts}
    if args.max_tokens is not None:
        probe["max_tokens"] = args.max_tokens
    if args.timeout is not None:
        probe["timeout"] = f"{args.timeout}s"
    if args.concurrency is not None:
        probe["concurrency"] = args.concurrency
    route: dict[str, Any] = {
        "name": "candidate",
        "engine": args.engine,
        "url": args.url.rstrip("/") + "/metrics",
        "probe": probe,
    }
    if args.reference_prometheus:  # validated as a route's seed_from, which asks the same question
        seed = {"prometheus": args.reference_prometheus, "query_selector": args.selector, "min_nodes": args.min_nodes}
        route["detection"] = {"seed_from": seed}
    config = parse_config({"gpu": {"enabled": "false"}, "routes": [route]})
    routed = config.routes[0]
    if args.http_config_file:
        routed = replace(routed, http=load_http_client_config(args.http_config_file))
    if args.reference_http_config_file:
        seed_from = routed.detection.seed_from
        if seed_from is None:
            raise ConfigError(["--reference-http.config.file needs --reference-prometheus"])
        seed_from = replace(seed_from, http=load_http_client_config(args.reference_http_config_file))
        routed = replace(routed, detection=replace(routed.detection, seed_from=seed_from))
    return replace(config, routes=(routed,))


def _key(config: Config) -> BaselineKey:
    source = make_source(config.routes[0], config)
    try:
        sample = source.sample(time.time())
    finally:
        source.close()
    return BaselineKey(
        sample.model_name, sample.engine_version, int(sample.num_speculative_tokens or 0), sample.drafter
    )


def _reference(
    args: argparse.Namespace, prompt_set: PromptSet, key: BaselineKey, config: Config
) -> dict[str, Acceptance] | FleetReference:
    """The reference's per-prompt acceptance, or the fleet's traffic baseline. Raises ValueError saying what is
    missing or does not match."""
    if sum(map(bool, (args.reference, args.state_dir, args.reference_prometheus))) != 1:
        raise ValueError(
            "give one reference: --reference FILE, --state.dir DIR with --route ROUTE, "
            "or --reference-prometheus URL with --route ROUTE"
        )
    if args.reference_prometheus:
        seed = config.routes[0].detection.seed_from
        assert seed is not None  # _config set it from --reference-prometheus
        return _fleet_reference(args, seed, key)
    if args.reference:
        try:
            doc = json.loads(Path(args.reference).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{args.reference}: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != REFERENCE_FORMAT:
            raise ValueError(f"{args.reference}: not a reference written by `specwatch gate record`")
        if doc.get("prompt_set", {}).get("hash") != prompt_set.hash:
            raise ValueError(
                f"{args.reference}: recorded with prompt set {doc.get('prompt_set')}, not {prompt_set.hash}: "
                "record it again with the same --prompts"
            )
        return {pid: Acceptance(p["drafted"], p["accepted"], p["steps"]) for pid, p in doc["prompts"].items()}
    if not args.route:
        raise ValueError("--state.dir needs --route")
    store = StateStore.in_state_dir(args.state_dir, repair=False, readonly=True)
    try:
        state = store.probe_state(args.route) or {}
        ref = state.get("reference_key") if state.get("prompt_set") == prompt_set.hash else None
        keys = [BaselineKey.from_json(ref)] if ref else store.fingerprint_keys(args.route, prompt_set.hash)
        if len(keys) != 1:
            found = ", ".join(k.label() for k in keys) or "none"
            raise ValueError(
                f"route {args.route}: want one canary fingerprint for prompt set {prompt_set.hash}, found {found}"
            )
        return {
            pid: Acceptance(d, a, s)
            for pid, (d, a, s) in store.fingerprint(args.route, keys[0], prompt_set.hash).items()
        }
    finally:
        store.close()


def _fleet_reference(args: argparse.Namespace, seed: SeedFrom, key: BaselineKey) -> FleetReference:
    """The fleet's median baseline for --route and the key (the candidate's, or --reference-*), with the checks
    a seeding node applies (fleet_seed.py: one deadline, a body cap, values in range, min_nodes)."""
    if not args.route:
        raise ValueError("--reference-prometheus needs --route: the route whose baseline the fleet's nodes export")
    ref_key = BaselineKey(
        args.reference_model or key.model_name,
        key.engine_version if args.reference_engine_version is None else args.reference_engine_version,
        key.k if args.reference_draft_length is None else args.reference_draft_length,
    )
    try:
        fleet = fleet_baseline(args.route, ref_key, seed)
    except SeedError as exc:
        raise ValueError(f"no fleet baseline for route {args.route}, {ref_key.label()} ({exc.reason}): {exc}") from None
    return FleetReference(seed.prometheus, args.route, ref_key, fleet.acceptance_ratio, fleet.nodes, fleet.left_out)


def _record(args: argparse.Namespace, rnd: Round, prompt_set: PromptSet, key: BaselineKey, console: Console) -> int:
    read = {pid: a for pid, a in rnd.read().items() if a.drafted > 0}
    if rnd.outcome != "ok" or not read:
        print(f"specwatch gate record: round {rnd.outcome}: {rnd.message}; nothing written", file=sys.stderr)
        return 2
    doc = {
        "format": REFERENCE_FORMAT,
        "recorded": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "url": args.url,
        "engine": args.engine,
        "model": key.model_name,
        "engine_version": key.engine_version,
        "draft_length": key.k,
        "method": rnd.method,
        "prompt_set": {"name": prompt_set.name, "hash": prompt_set.hash},
        "prompts": {pid: {"drafted": a.drafted, "accepted": a.accepted, "steps": a.steps} for pid, a in read.items()},
    }
    Path(args.out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    totals = rnd.totals()
    console.print(f"recorded {len(read)} prompts of {key.label()} to {args.out}: acceptance {totals.ratio:.3f}")
    return 0


def _document(
    verdict: GateVerdict,
    rnd: Round,
    key: BaselineKey,
    prompt_set: PromptSet,
    reference: dict[str, Acceptance] | FleetReference,
    speedup: SpeedupVerdict | None,
    sweep: dict[str, Any] | None,
    exit_code: int,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "verdict": verdict.verdict,
        "exit_code": exit_code,
        "reason": verdict.reason,
        "model": key.model_name,
        "engine_version": key.engine_version,
        "draft_length": key.k,
        "prompt_set": {"name": prompt_set.name, "hash": prompt_set.hash},
        "method": rnd.method,
        "reference": _reference_document(reference),
        "threshold": verdict.threshold,
        "confidence": verdict.confidence,
        "paired_prompts": verdict.paired,
        "drafted_tokens": verdict.drafted,
        "candidate_ratio": verdict.candidate_ratio,
        "reference_ratio": verdict.reference_ratio,
        "drop": verdict.drop,
        "drop_interval": [verdict.drop_low, verdict.drop_high],
        "prompts": [
            {"id": pid, "candidate_ratio": c, "reference_ratio": r} for pid, (c, r) in verdict.per_prompt.items()
        ]
        + [{"id": p.prompt_id, "error": p.error} for p in rnd.prompts if p.acceptance is None],
    }
    if isinstance(reference, FleetReference):  # no per-prompt reference: the candidate's own ratios
        doc["prompts"] = [
            {"id": p.prompt_id, "candidate_ratio": p.acceptance.ratio}
            if p.acceptance is not None
            else {"id": p.prompt_id, "error": p.error}
            for p in rnd.prompts
        ]
    if speedup is not None and sweep is not None:
        doc["throughput"] = {
            "verdict": speedup.verdict,
            "reason": speedup.reason,
            "required": speedup.required,
            "exit_code": speedup.exit_code,
            "min_speedup": speedup.min_speedup,
            "plain_url": sweep["plain_url"],
            "failure": sweep["failure"],
            "levels": [
                {
                    "concurrency": lv["concurrency"],
                    "speedup": lv["speedup"],
                    "speedup_interval": [point.low, point.high],
                    "plain_output_tokens_per_s": lv["plain"]["output_tokens_per_s"],
                    "spec_output_tokens_per_s": lv["spec"]["output_tokens_per_s"],
                }
                for lv, point in zip(sweep["levels"], speedup.points)
            ],
        }
    return doc


def _reference_document(reference: dict[str, Acceptance] | FleetReference) -> dict[str, Any]:
    if isinstance(reference, FleetReference):
        return {
            "kind": "fleet_traffic_baseline",
            "comparison": "the candidate's pooled probe acceptance against the traffic mix's (not per prompt)",
            "prometheus": reference.prometheus,
            "route": reference.route,
            "model": reference.key.model_name,
            "engine_version": reference.key.engine_version,
            "draft_length": reference.key.k,
            "ratio": reference.ratio,
            "nodes": reference.nodes,
            "nodes_left_out": reference.left_out,
        }
    return {"kind": "fingerprint", "comparison": "per prompt, paired", "prompts": len(reference)}


def _junit(verdict: GateVerdict, rnd: Round, key: BaselineKey, speedup: SpeedupVerdict | None = None) -> ET.ElementTree:
    """One testsuite: a testcase per prompt (its change, informational) and the verdict's own testcase, which
    fails on `fail` and is skipped (with the reason) on `inconclusive`. With a sweep, a `low-batch speedup`
    testcase: failed or skipped as the acceptance's when --require-speedup, else a fail is skipped (reported,
    not gating)."""
    suite = ET.Element("testsuite", name=f"specwatch gate {key.label()}", time=f"{rnd.duration_seconds:.3f}")
    for pid, (c, r) in verdict.per_prompt.items():
        case = ET.SubElement(suite, "testcase", classname="specwatch.gate.prompt", name=pid)
        ET.SubElement(case, "system-out").text = f"acceptance {c:.4f}, reference {r:.4f}"
    for p in rnd.prompts:
        if p.acceptance is None:
            case = ET.SubElement(suite, "testcase", classname="specwatch.gate.prompt", name=p.prompt_id)
            ET.SubElement(case, "error", message=p.error or "no acceptance read")
    case = ET.SubElement(suite, "testcase", classname="specwatch.gate", name="acceptance drop")
    if verdict.verdict == "fail":
        ET.SubElement(case, "failure", message=verdict.reason, type="AcceptanceDrop")
    elif verdict.verdict == "inconclusive":
        ET.SubElement(case, "skipped", message=verdict.reason)
    if speedup is not None:
        case = ET.SubElement(suite, "testcase", classname="specwatch.gate", name="low-batch speedup")
        if speedup.verdict == "fail" and speedup.required:
            ET.SubElement(case, "failure", message=speedup.reason, type="NoSpeedup")
        elif speedup.verdict != "pass":
            note = "" if speedup.required else " (not gating: --require-speedup)"
            ET.SubElement(case, "skipped", message=speedup.reason + note)
        else:
            ET.SubElement(case, "system-out").text = speedup.reason
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.ElementTree(root)


def _table(rnd: Round, reference: dict[str, Acceptance]) -> Table:
    table = Table(title="gate round", title_justify="left")
    table.add_column("prompt", no_wrap=True)
    for name in ("kind", "acceptance", "reference", "change"):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for p in rnd.prompts:
        a, ref = p.acceptance, reference.get(p.prompt_id)
        if a is None:
            table.add_row(p.prompt_id, p.kind, _DASH, _DASH, p.error[:60])
            continue
        ratio, ref_ratio = a.ratio, ref.ratio if ref is not None else None
        change = f"{ratio / ref_ratio - 1:+.1%}" if ratio is not None and ref_ratio else _DASH
        table.add_row(
            p.prompt_id,
            p.kind,
            f"{ratio:.3f}" if ratio is not None else _DASH,
            f"{ref_ratio:.3f}" if ref_ratio is not None else _DASH,
            change,
        )
    return table
