"""`specwatch simulate`: serve a SIMULATED vLLM or SGLang engine (exact `/metrics` format + OpenAI API)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading

from specwatch.commands import add_deprecated_alias
from specwatch.simulator.scenario import Scenario, ScenarioError, load_scenario
from specwatch.simulator.server import RunningSimulator
from specwatch.simulator.simulation import DEFAULT_MODEL, ENGINE_KINDS, Simulation, SimulationSpec
from specwatch.simulator.speculation import parse_profile
from specwatch.simulator.steptime import AnalyticStepTime, StepTimeModel, load_table

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}  # the engines' own defaults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINE_KINDS, default="vllm", help="engine to imitate (default vllm)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, help="port to listen on; 0 picks a free one (default: 8000 for vllm, 30000 for sglang)"
    )
    parser.add_argument("--scenario", metavar="FILE", help="YAML/JSON scenario: starting setup and timed events")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel engines (vLLM `engine`, SGLang `dp_rank`)")
    parser.add_argument("--model", help=f"served model name (default: the scenario's, else {DEFAULT_MODEL})")
    parser.add_argument(
        "--draft.length",
        dest="k",
        type=int,
        metavar="K",
        help="draft tokens per step, 0 = speculation off (default: scenario's, else 4)",
    )
    add_deprecated_alias(parser, "--k", "--draft.length", "k", type=int)
    parser.add_argument(
        "--acceptance",
        metavar="ALPHA[,ALPHA...]",
        help="conditional acceptance per position: one value for all, or k values (default 0.7)",
    )
    parser.add_argument(
        "--step-time",
        choices=("table", "analytic"),
        default="table",
        help="step-time model: a measured table (default) or the analytic roofline",
    )
    parser.add_argument(
        "--step-table",
        metavar="FILE",
        help="step-time table in the reference JSON format (default: packaged H200 Llama-3-8B)",
    )
    parser.add_argument("--context", type=int, default=1024, help="context per sequence for the table (default 1024)")
    parser.add_argument(
        "--load", type=float, help="built-in offered concurrency at start (default: scenario's, else 0)"
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="run S times faster than real time (default 1)")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="max running requests per engine (default 256)")
    parser.add_argument(
        "--custom-labels",
        metavar="NAME[,NAME...]",
        default="",
        help="SGLang: tokenizer metric labels requests may set with the x-custom-labels header "
        "(like --tokenizer-metrics-allowed-custom-labels), e.g. route",
    )
    parser.add_argument("--seed", type=int, help="random seed for reproducible acceptance draws and load")
    parser.add_argument(
        "--per-request-spec-decode-metrics",
        choices=("none", "summary"),
        default="none",
        help="vLLM: answer completions with metrics.speculative_decoding, as vLLM 0.32+ does when "
        "started with this flag (default none, vLLM's default)",
    )
    parser.add_argument(
        "--repeatable-greedy",
        action="store_true",
        help="temperature-0 requests accept the same way for the same prompt, as on a real engine "
        "(for canary probes; off by default so that a few replayed prompts still measure the "
        "configured acceptance)",
    )


def build_spec(args: argparse.Namespace, scenario: Scenario) -> SimulationSpec:
    """Merge command-line flags (when given) over the scenario's setup over the defaults."""
    k = args.k if args.k is not None else (scenario.k if scenario.k is not None else 4)
    if args.acceptance:
        try:
            values = [float(v) for v in args.acceptance.split(",")]
        except ValueError:
            raise ValueError(
                f"--acceptance: want ALPHA or k comma-separated values in 0-1, got {args.acceptance!r}"
            ) from None
        acceptance: float | tuple[float, ...] = values[0] if len(values) == 1 else tuple(values)
    else:
        acceptance = scenario.acceptance if scenario.acceptance is not None else 0.7
    if k:
        parse_profile(acceptance, k)  # fail early with a clear message
    step_time: StepTimeModel = (
        AnalyticStepTime(context=args.context)
        if args.step_time == "analytic"
        else load_table(args.step_table, context=args.context)
    )
    if args.load is not None:
        scenario = dataclasses.replace(scenario, load=args.load)
    return SimulationSpec(
        engine_kind=args.engine,
        model_name=args.model or scenario.model_name or DEFAULT_MODEL,
        dp=args.dp,
        k=k,
        acceptance=acceptance,
        step_time=step_time,
        time_scale=args.time_scale,
        scenario=scenario,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
        custom_labels=tuple(n for n in args.custom_labels.split(",") if n),
        per_request_spec_decode_metrics=args.per_request_spec_decode_metrics,
        repeatable_greedy=args.repeatable_greedy,
    )


def main(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario) if args.scenario else Scenario()
        spec = build_spec(args, scenario)
        port = args.port if args.port is not None else DEFAULT_PORTS[args.engine]
        running = RunningSimulator(Simulation(spec), host=args.host, port=port)
    except (ScenarioError, ValueError, OSError) as exc:
        print(f"specwatch simulate: {exc}", file=sys.stderr)
        return 2
    running.start()
    print(
        f"SIMULATED {spec.engine_kind} engine (specwatch simulator) at {running.url}  "
        f"metrics: {running.url}/metrics  OpenAI: {running.url}/v1",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("stopping the simulated %s engine", spec.engine_kind)
    running.stop()
    return 0
