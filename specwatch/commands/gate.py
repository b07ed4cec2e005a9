"""`specwatch gate`: catch a model or drafter bump before it ships.

    specwatch gate --url http://staging:8000 --engine vllm --reference prod-ref.json [--junit out.xml]
    specwatch gate record --url http://prod:8000 --engine vllm --out prod-ref.json

`gate` sends the probe set (built-in, or `--prompts FILE`) greedily to a candidate server, reads each prompt's
acceptance as the daemon's canary probes do (probe/runner.py: the engine's per-request fields, else counter
bracketing), and judges the drop against a reference with a confidence interval (probe/gate.py). It prints a
per-prompt table and the verdict, writes `--json` and `--junit` for CI, and exits 0 (pass), 1 (a drop at or
beyond `--drop`, with the evidence to say so) or 2 (inconclusive: too few prompts or tokens read, server
errors, or an interval too wide to decide). The reference is a file `gate record` wrote from a production server
(version it beside the deploy manifest), or the fingerprint a node's daemon keeps (`--state.dir`, `--route`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specwatch.config import Config, ConfigError, load_http_client_config, parse_config
from specwatch.engine_kinds import ENGINE_KINDS
from specwatch.evaluators.canary import bracket_scraper
from specwatch.probe.gate import GateVerdict, judge
from specwatch.probe.prompts import BUILTIN, PromptSet, PromptSetError, load_prompt_set
from specwatch.probe.responses import Acceptance
from specwatch.probe.runner import ProbeRunner, Round
from specwatch.sources.base import SourceError
from specwatch.sources.engines import make_source
from specwatch.state.baselines import BaselineKey
from specwatch.state.store import StateStore

REFERENCE_FORMAT = "specwatch-gate-reference/1"
_DASH = "–"


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
    except (ConfigError, PromptSetError) as exc:
        print(f"specwatch gate: {exc}", file=sys.stderr)
        return 2
    route = config.routes[0]
    try:
        key = _key(config)
    except SourceError as exc:
        print(f"specwatch gate: cannot read {route.url}: {exc}", file=sys.stderr)
        return 2
    if args.gate_action != "record":
        try:
            reference = _reference(args, prompt_set, key)
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
    else:
        verdict = judge(rnd.read(), reference, args.drop, args.confidence)
    console.print(_table(rnd, reference))
    style = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}[verdict.verdict]
    console.print(f"[{style}]{verdict.verdict.upper()}[/]: {verdict.reason}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(_document(verdict, rnd, key, prompt_set), indent=2) + "\n")
    if args.junit_out:
        _junit(verdict, rnd, key).write(args.junit_out, encoding="utf-8", xml_declaration=True)
    return verdict.exit_code


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
    config = parse_config({"gpu": {"enabled": "false"}, "routes": [route]})
    if not args.http_config_file:
        return config
    http = load_http_client_config(args.http_config_file)
    return replace(config, routes=(replace(config.routes[0], http=http),))


def _key(config: Config) -> BaselineKey:
    source = make_source(config.routes[0], config)
    try:
        sample = source.sample(time.time())
    finally:
        source.close()
    return BaselineKey(sample.model_name, sample.engine_version, int(sample.num_speculative_tokens or 0))


def _reference(args: argparse.Namespace, prompt_set: PromptSet, key: BaselineKey) -> dict[str, Acceptance]:
    """The reference's per-prompt acceptance. Raises ValueError saying what is missing or does not match."""
    if bool(args.reference) == bool(args.state_dir):
        raise ValueError("give one reference: --reference FILE, or --state.dir DIR with --route ROUTE")
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
        keys = (
            [BaselineKey(str(ref[0]), str(ref[1]), int(ref[2]))]
            if ref
            else store.fingerprint_keys(args.route, prompt_set.hash)
        )
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


def _document(verdict: GateVerdict, rnd: Round, key: BaselineKey, prompt_set: PromptSet) -> dict[str, Any]:
    return {
        "verdict": verdict.verdict,
        "exit_code": verdict.exit_code,
        "reason": verdict.reason,
        "model": key.model_name,
        "engine_version": key.engine_version,
        "draft_length": key.k,
        "prompt_set": {"name": prompt_set.name, "hash": prompt_set.hash},
        "method": rnd.method,
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


def _junit(verdict: GateVerdict, rnd: Round, key: BaselineKey) -> ET.ElementTree:
    """One testsuite: a testcase per prompt (its change, informational) and the verdict's own testcase, which
    fails on `fail` and is skipped (with the reason) on `inconclusive`."""
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
