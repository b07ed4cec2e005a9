#!/usr/bin/env python3
"""Fixtures for TensorRT-LLM, NVIDIA Dynamo and llama.cpp, whose metric code cannot run here.

Neither engine's metric code installs on this machine (PyPI's tensorrt-llm is a placeholder that fails to
build; llama.cpp's is C++), so the metric *definitions and update rules* are transcribed from the engines'
source and the traffic is synthetic:

- TensorRT-LLM: `tensorrt_llm/metrics/collector.py` at NVIDIA/TensorRT-LLM commit 050f80def8df. The
  families below are declared with prometheus_client exactly as `MetricsCollector.__init__` declares them
  (name, HELP, label names `model_name`, `engine_type`, `token_position`), and fed the way
  `log_iteration_stats` (specDecodingStats, one dict per iteration) and `log_request_metrics_dict` (per
  request at finish, positions up to the last one drafted) feed them; prometheus_client renders the text.
  trtllm-serve's JSON /metrics fixture is the list of iteration-stats dicts the same traffic produced, keyed
  as `log_iteration_stats` reads them.
- Dynamo: its pass-through (`components/src/dynamo/common/utils/prometheus.py` at ai-dynamo/dynamo commit
  041ec8b0a9da, `get_prometheus_expfmt(exclude_prefixes=["python_", "process_"], add_prefix="trtllm_")`)
  applied to the TensorRT-LLM text. The prefix-stripped, backend="trtllm" spelling is NOT from Dynamo's
  source (not found there); its fixture only exercises that spelling.
- llama.cpp: `server_task_result_metrics::to_metrics()` in tools/server/server-task.cpp of the llama.cpp
  vendored in PyPI's llama-cpp-python 0.3.36 sdist (llama.cpp commit 0c1e57098bba): the stream format
  `# HELP llamacpp:<name> <help>`, `# TYPE`, `llamacpp:<name> <value>`, the counters and gauges written as
  doubles (the C++ stream's default 6 significant digits), the per-position counter as uint64; a slot's counts
  added to the server's when the slot resets after its request (`metrics_on_prediction`).

    .venv/bin/python scripts/capture/transcribed.py --out tests/fixtures

Writes each fixture with a provenance header and a `.truth.json` beside it (the counters fed in).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import random
import re
from pathlib import Path

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge

TRTLLM_COMMIT = "050f80def8df236e326949c8bd9dee10fd896a83"
DYNAMO_COMMIT = "041ec8b0a9da970374a2d52190c4d7f2c6ec6090"


def accepted_prefix(rng: random.Random, k: int, p: float) -> int:
    """Accepted prefix of one k-token draft: position j accepted with p x 0.93^j, stopping at a rejection."""
    n = 0
    while n < k and rng.random() < p * (0.93**n):
        n += 1
    return n


# ------------------------------------------------------------------------------------------ TensorRT-LLM
class TrtllmCollector:
    """The spec-decode, load and token families of TensorRT-LLM's MetricsCollector, declared as it declares
    them (collector.py), on a registry of their own."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        self.labels = labels
        names = list(labels)
        p, r = "trtllm_", self.registry
        self.generation_tokens = Counter(
            p + "generation_tokens_total",
            "Cumulative number of generation (output) tokens produced.",
            names,
            registry=r,
        )
        self.kv_cache_utilization = Gauge(p + "kv_cache_utilization", "KV cache utilization", names, registry=r)
        self.num_requests_running = Gauge(p + "num_requests_running", "Number of active requests", names, registry=r)
        self.num_requests_waiting = Gauge(p + "num_requests_waiting", "Number of queued requests", names, registry=r)
        self.spec_draft = Counter(
            p + "spec_decode_num_draft_tokens_total",
            "Total number of draft tokens in speculative decoding",
            names,
            registry=r,
        )
        self.spec_accepted = Counter(
            p + "spec_decode_num_accepted_tokens_total",
            "Total number of accepted tokens in speculative decoding",
            names,
            registry=r,
        )
        self.spec_length = Gauge(
            p + "spec_decode_acceptance_length", "Acceptance length in speculative decoding", names, registry=r
        )
        self.spec_overhead = Gauge(
            p + "spec_decode_draft_overhead", "Draft overhead in speculative decoding", names, registry=r
        )
        pos_names = [*names, "token_position"]
        self.drafted_per_pos = Counter(
            p + "spec_decode_drafted_tokens_total",
            "Total drafted tokens per speculative decoding position.",
            pos_names,
            registry=r,
        )
        self.accepted_per_pos = Counter(
            p + "spec_decode_accepted_tokens_total",
            "Total accepted tokens per speculative decoding position.",
            pos_names,
            registry=r,
        )

    def log_iteration_stats(self, stats: dict) -> None:
        """collector.py's log_iteration_stats, the branches for the families above."""
        lab = self.labels
        if "numActiveRequests" in stats:
            self.num_requests_running.labels(**lab).set(stats["numActiveRequests"])
        if "numQueuedRequests" in stats:
            self.num_requests_waiting.labels(**lab).set(stats["numQueuedRequests"])
        kv = stats.get("kvCacheStats")
        if kv and "usedNumBlocks" in kv and "maxNumBlocks" in kv and kv["maxNumBlocks"]:
            self.kv_cache_utilization.labels(**lab).set(kv["usedNumBlocks"] / kv["maxNumBlocks"])
        if spec := stats.get("specDecodingStats"):
            if spec.get("numDraftTokens", 0) > 0:
                self.spec_draft.labels(**lab).inc(spec["numDraftTokens"])
            if spec.get("numAcceptedTokens", 0) > 0:
                self.spec_accepted.labels(**lab).inc(spec["numAcceptedTokens"])
            if "acceptanceLength" in spec:
                self.spec_length.labels(**lab).set(spec["acceptanceLength"])
            if "draftOverhead" in spec:
                self.spec_overhead.labels(**lab).set(spec["draftOverhead"])

    def log_request_metrics(self, generation_tokens: int, drafted: list[int], accepted: list[int]) -> None:
        """collector.py's log_request_metrics_dict for a finished request: tokens and per-position counts,
        emitted up to the last position with a drafted token; zero counts are not incremented."""
        if generation_tokens:
            self.generation_tokens.labels(**self.labels).inc(generation_tokens)
        last = max((i for i, n in enumerate(drafted) if n > 0), default=-1)
        for pos in range(last + 1):
            labels = {**self.labels, "token_position": pos}
            if drafted[pos] > 0:
                self.drafted_per_pos.labels(**labels).inc(drafted[pos])
            if accepted[pos] > 0:
                self.accepted_per_pos.labels(**labels).inc(accepted[pos])

    def render(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


class TrtllmTraffic:
    """Requests decoding with drafts; iteration stats and per-request results as TensorRT-LLM produces them
    (pyexecutor: numDraftTokens / numAcceptedTokens / numRequestsWithDraftTokens summed over the requests
    that drafted in the iteration, acceptanceLength = (accepted + requests) / requests)."""

    def __init__(self, collector: TrtllmCollector, ks: list[int], p: float, seed: int) -> None:
        self.c, self.ks, self.p = collector, ks, p
        self.rng = random.Random(seed)
        self.iter = 0
        self.iterations: list[dict] = []  # the JSON /metrics body of the traffic since the last take
        self.truth = {
            "draft_tokens": 0,
            "accepted_tokens": 0,
            "drafts": 0,
            "generation_tokens": 0,
            "drafted_per_pos": [0] * max(ks),
            "accepted_per_pos": [0] * max(ks),
        }

    def run(self, requests: int, concurrent: int) -> None:
        rng = self.rng
        active = [self._new_request() for _ in range(concurrent)]
        finished = 0
        while finished < requests:
            spec = {"numDraftTokens": 0, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 0}
            done = []
            for req in active:
                k = req["k"]
                n = accepted_prefix(rng, k, self.p)
                spec["numDraftTokens"] += k
                spec["numAcceptedTokens"] += n
                spec["numRequestsWithDraftTokens"] += 1
                for j in range(k):
                    req["drafted"][j] += 1
                for j in range(n):
                    req["accepted"][j] += 1
                req["generated"] += n + 1
                if req["generated"] >= req["length"]:
                    done.append(req)
            requests_with = spec["numRequestsWithDraftTokens"]
            spec["acceptanceLength"] = (spec["numAcceptedTokens"] + requests_with) / requests_with
            spec["draftOverhead"] = round(rng.uniform(0.08, 0.14), 4)
            spec["iterLatencyMS"] = round(rng.uniform(9.0, 14.0), 3)
            self.iter += 1
            stats = {
                "iter": self.iter,
                "iterLatencyMS": round(rng.uniform(18.0, 26.0), 3),
                "numActiveRequests": len(active),
                "numQueuedRequests": rng.randint(0, 3),
                "numCompletedRequests": len(done),
                "maxNumActiveRequests": 64,
                "kvCacheStats": {
                    "maxNumBlocks": 4096,
                    "usedNumBlocks": 300 + 40 * len(active),
                    "freeNumBlocks": 3796 - 40 * len(active),
                    "tokensPerBlock": 32,
                },
                "specDecodingStats": spec,
            }
            self.iterations.append(stats)
            self.c.log_iteration_stats(stats)
            t = self.truth
            t["draft_tokens"] += spec["numDraftTokens"]
            t["accepted_tokens"] += spec["numAcceptedTokens"]
            t["drafts"] += requests_with
            for req in done:
                active.remove(req)
                self.c.log_request_metrics(req["generated"], req["drafted"], req["accepted"])
                t["generation_tokens"] += req["generated"]
                for j in range(len(req["drafted"])):
                    t["drafted_per_pos"][j] += req["drafted"][j]
                    t["accepted_per_pos"][j] += req["accepted"][j]
                finished += 1
                if finished + len(active) < requests:
                    active.append(self._new_request())

    def _new_request(self) -> dict:
        k = self.rng.choice(self.ks)
        width = max(self.ks)
        return {
            "k": k,
            "length": self.rng.randint(40, 120),
            "generated": 0,
            "drafted": [0] * width,
            "accepted": [0] * width,
        }

    def take_iterations(self) -> list[dict]:
        out, self.iterations = self.iterations, []
        return out


# ------------------------------------------------------------------------------------------ Dynamo
def dynamo_passthrough(text: str) -> str:
    """get_prometheus_expfmt(exclude_prefixes=["python_", "process_"], add_prefix="trtllm_"): drop the
    excluded families, add the prefix where a name lacks it (TensorRT-LLM's names already carry it)."""
    exclude = re.compile(r"^(# (HELP|TYPE) )?(python_|process_)")
    help_type = re.compile(r"^# (HELP|TYPE) (\S+)(.*)$")
    lines = []
    for line in text.split("\n"):
        if not line.strip() or exclude.match(line):
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, name, rest = help_type.match(line).groups()
            name = name if name.startswith("trtllm_") else "trtllm_" + name
            line = f"# {kind} {name}{rest}"
        elif not line.startswith("#"):
            name, _, rest = line.partition(" ")
            name = name if name.startswith("trtllm_") else "trtllm_" + name
            line = name + (" " + rest if rest else "")
        lines.append(line)
    return "\n".join(lines) + "\n"


def dynamo_stripped(text: str) -> str:
    """The prefix-stripped spelling with backend="trtllm" (unconfirmed shape, see the module docstring)."""
    out = []
    for line in dynamo_passthrough(text).split("\n"):
        if not line:
            continue
        line = line.replace("trtllm_", "", 1)
        if not line.startswith("#"):
            name, _, rest = line.partition(" ")
            if "{" in name:
                name = name.replace("{", '{backend="trtllm",', 1)
            else:
                name += '{backend="trtllm"}'
            line = f"{name} {rest}"
        out.append(line)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ llama.cpp
def cpp_number(value: float) -> str:
    """`std::stringstream << double` with default flags: %g with 6 significant digits."""
    return f"{value:g}"


def llamacpp_text(m: dict) -> str:
    """server_task_result_metrics::to_metrics(): counters, then gauges, then the per-position counter."""
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", m["prompt_tokens"]),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0),
        ("prompt_seconds_total", "Total time spent processing prompts", m["prompt_seconds"]),
        ("tokens_predicted_total", "Number of generation tokens processed", m["generation_tokens"]),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", m["predict_seconds"]),
        (
            "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            m["n_decode"],
        ),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", m["n_tokens_max"]),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", m["draft_tokens"]),
        (
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            m["accepted_tokens"],
        ),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", m["drafts"]),
    ]
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", m["prompt_tps"]),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s", m["predict_tps"]),
        ("requests_processing", "Number of requests processing", m["processing"]),
        ("requests_deferred", "Number of requests deferred", m["deferred"]),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", m["busy_per_decode"]),
    ]
    out = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, help_, value in items:
            out += [
                f"# HELP llamacpp:{name} {help_}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {cpp_number(value)}",
            ]
    if m["accepted_per_pos"]:
        out += [
            "# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position",
            "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        out += [
            f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {int(v)}'
            for i, v in enumerate(m["accepted_per_pos"])
        ]  # std::vector<uint64_t>: printed exactly
    return "\n".join(out) + "\n"


class LlamacppServer:
    """Slots decoding with a draft model: per-slot counts added to the server totals at request finish."""

    def __init__(self, n_max: int, p: float, seed: int, base: int = 0) -> None:
        self.n_max, self.p = n_max, p
        self.rng = random.Random(seed)
        # `base` stands for a long-running server: counts before the traffic below (all of them at once).
        self.m = {
            "prompt_tokens": 0,
            "prompt_seconds": 0.0,
            "generation_tokens": 0,
            "predict_seconds": 0.0,
            "n_decode": 0,
            "n_tokens_max": 0,
            "draft_tokens": 0,
            "accepted_tokens": 0,
            "drafts": 0,
            "accepted_per_pos": [],
            "prompt_tps": 0.0,
            "predict_tps": 0.0,
            "processing": 0,
            "deferred": 0,
            "busy_per_decode": 0.0,
        }
        if base:
            self.finish_requests(base, processing=0)

    def finish_requests(self, requests: int, processing: int) -> None:
        m, rng = self.m, self.rng
        for _ in range(requests):
            prompt, length = rng.randint(20, 200), rng.randint(30, 160)
            drafted = accepted = steps = generated = 0
            per_pos = [0] * self.n_max
            while generated < length:
                n = accepted_prefix(rng, self.n_max, self.p)
                steps += 1
                drafted += self.n_max
                accepted += n
                for j in range(n):
                    per_pos[j] += 1
                generated += n + 1
            m["prompt_tokens"] += prompt
            m["prompt_seconds"] += prompt * 0.0004
            m["generation_tokens"] += generated
            m["predict_seconds"] += steps * 0.021
            m["n_decode"] += steps + 1
            m["n_tokens_max"] = max(m["n_tokens_max"], prompt + generated)
            m["draft_tokens"] += drafted
            m["accepted_tokens"] += accepted
            m["drafts"] += steps
            m["accepted_per_pos"] = [a + b for a, b in zip(m["accepted_per_pos"] or [0] * self.n_max, per_pos)]
        m["prompt_tps"] = round(m["prompt_tokens"] / max(m["prompt_seconds"], 1e-9), 3)
        m["predict_tps"] = round(m["generation_tokens"] / max(m["predict_seconds"], 1e-9), 3)
        m["processing"], m["deferred"] = processing, rng.randint(0, 2)
        m["busy_per_decode"] = round(rng.uniform(1.0, 3.0), 4)

    def truth(self) -> dict:
        keys = ("drafts", "draft_tokens", "accepted_tokens", "generation_tokens", "accepted_per_pos")
        return {"k": self.n_max, **{key: self.m[key] for key in keys}}


# ------------------------------------------------------------------------------------------ writing
def header(lines: list[str]) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return "".join(
        f"# {line}\n"
        for line in [*lines, f"date: {stamp}", "ground truth fed in: the .truth.json file beside this one"]
    )


def write(out: Path, name: str, head: str, text: str, truth: dict) -> None:
    path = out / f"{name}.prom"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + text)
    (out / f"{name}.truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")


def capture_trtllm(out: Path, seed: int) -> None:
    trt_source = f"tensorrt_llm/metrics/collector.py @ NVIDIA/TensorRT-LLM {TRTLLM_COMMIT[:12]}"
    for name, ks, p in (("serve_k3", [3], 0.75), ("serve_dynamic_k", [1, 2, 4], 0.8)):
        collector = TrtllmCollector({"model_name": "llama-3.1-8b-instruct", "engine_type": "trtllm"})
        traffic = TrtllmTraffic(collector, ks, p, seed)
        head_lines = [
            f"engine: TensorRT-LLM (trtllm-serve /prometheus/metrics), transcribed from {trt_source}",
            "how made: scripts/capture/transcribed.py (families declared as MetricsCollector declares "
            "them, fed as log_iteration_stats / log_request_metrics_dict feed them; synthetic traffic)",
            f"args: draft lengths per request={ks} accept_p={p} seed={seed}; "
            f"prometheus_client {importlib.metadata.version('prometheus-client')}, single-process "
            "(whether trtllm-serve renders in multiprocess mode, without _created, was not confirmed)",
        ]
        for scrape, requests in ((1, 24), (2, 18)):
            traffic.run(requests, concurrent=6)
            iterations = traffic.take_iterations()
            suffix = "" if scrape == 1 else "_scrape2"
            truth = {**traffic.truth, "k": max(ks)}
            write(out, f"trtllm/{name}{suffix}", header(head_lines), collector.render(), truth)
            if name == "serve_k3":
                (out / f"trtllm/iteration_stats{suffix}.json").write_text(json.dumps(iterations, indent=1) + "\n")
                (out / f"trtllm/iteration_stats{suffix}.truth.json").write_text(
                    json.dumps(truth, indent=1, sort_keys=True) + "\n"
                )
                dynamo_lines = [
                    f"engine: TensorRT-LLM under NVIDIA Dynamo (worker /metrics pass-through), "
                    f"the text above transformed as components/src/dynamo/common/utils/prometheus.py "
                    f"@ ai-dynamo/dynamo {DYNAMO_COMMIT[:12]} does (add_prefix=trtllm_)",
                    *head_lines,
                ]
                write(
                    out,
                    f"dynamo/trtllm_passthrough{suffix}",
                    header(dynamo_lines),
                    dynamo_passthrough(collector.render()),
                    truth,
                )
                stripped_lines = [
                    'engine: TensorRT-LLM, prefix-stripped with backend="trtllm": the spelling the '
                    "issue attributes to Dynamo's OpenTelemetry bridge; NOT found in Dynamo's source, "
                    "so this shape is unconfirmed",
                    *head_lines,
                ]
                write(
                    out,
                    f"dynamo/trtllm_stripped{suffix}",
                    header(stripped_lines),
                    dynamo_stripped(collector.render()),
                    truth,
                )


def capture_llamacpp(out: Path, seed: int) -> None:
    head_lines = [
        "engine: llama.cpp llama-server --metrics, transcribed from tools/server/server-task.cpp "
        "server_task_result_metrics::to_metrics() of llama.cpp 0c1e57098bba (vendored in "
        "llama-cpp-python 0.3.36)",
        "how made: scripts/capture/transcribed.py (the C++ stream format, default 6 significant digits; "
        "slot counts added at request finish; synthetic traffic)",
        f"args: n_max=3 accept_p=0.7 seed={seed}",
    ]
    server = LlamacppServer(n_max=3, p=0.7, seed=seed)
    server.finish_requests(14, processing=2)
    write(out, "llamacpp/server_k3", header(head_lines), llamacpp_text(server.m), server.truth())
    server.finish_requests(9, processing=1)
    write(out, "llamacpp/server_k3_scrape2", header(head_lines), llamacpp_text(server.m), server.truth())
    idle = LlamacppServer(n_max=3, p=0.7, seed=seed)
    write(
        out,
        "llamacpp/server_nodraft",
        header([*head_lines, "no request finished yet: per-position absent"]),
        llamacpp_text(idle.m),
        idle.truth(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    capture_trtllm(args.out, args.seed)
    capture_llamacpp(args.out, args.seed)


if __name__ == "__main__":
    main()
