"""One simulated inference server: its DP engines, their metrics recorder, and the scenario that drives them.

This is what one `specwatch simulate` process serves (HTTP lives in `server.py`): a vLLM API server with
N DP engines, or an SGLang server with N DP ranks. It dispatches requests to the least-loaded engine, splits
the built-in load across engines, and applies scenario events on the simulated clock (acceptance changes,
model bumps, load ramps, restarts, outages).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from specwatch.simulator import metrics_sglang, metrics_vllm
from specwatch.simulator.clock import SimClock
from specwatch.simulator.engine import EngineSettings, EngineStatus, SimEngine, SimRequest
from specwatch.simulator.scenario import Event, Scenario
from specwatch.simulator.speculation import AcceptanceProfile, parse_profile
from specwatch.simulator.steptime import StepTimeModel, load_table

log = logging.getLogger(__name__)

ENGINE_KINDS = ("vllm", "sglang")
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_SCENARIO_POLL_REAL_SECONDS = 0.05


@dataclass
class SimulationSpec:
    engine_kind: str = "vllm"
    model_name: str = DEFAULT_MODEL
    dp: int = 1
    k: int = 4  # 0 = speculation off
    acceptance: float | tuple[float, ...] = 0.7
    step_time: StepTimeModel | None = None  # None: the packaged H200 table at context 1024
    time_scale: float = 1.0
    scenario: Scenario = field(default_factory=Scenario)
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 400_000
    max_model_len: int = 8192
    custom_labels: tuple[str, ...] = ()  # SGLang's --tokenizer-metrics-allowed-custom-labels
    seed: int | None = None
    # vLLM's --per-request-spec-decode-metrics (0.32+): "none" (vLLM's default) or "summary"
    per_request_spec_decode_metrics: str = "none"
    # Temperature-0 requests accept the same way for the same prompt, as on a real engine (canary probes).
    # Off by default: a load generator replaying few prompts would then measure those prompts, not the profile.
    repeatable_greedy: bool = False

    def __post_init__(self) -> None:
        if self.engine_kind not in ENGINE_KINDS:
            raise ValueError(f"engine must be one of {', '.join(ENGINE_KINDS)}, got {self.engine_kind!r}")
        if self.dp < 1:
            raise ValueError(f"dp must be >= 1, got {self.dp}")
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.per_request_spec_decode_metrics not in ("none", "summary"):
            raise ValueError(
                f"per_request_spec_decode_metrics must be none or summary, got {self.per_request_spec_decode_metrics!r}"
            )


class Simulation:
    def __init__(self, spec: SimulationSpec) -> None:
        self.spec = spec
        self.kind = spec.engine_kind
        self.version = metrics_vllm.ENGINE_VERSION if self.kind == "vllm" else metrics_sglang.ENGINE_VERSION
        self.clock = SimClock(spec.time_scale)
        self.model_name = spec.model_name
        self.k = spec.k
        self._step_time = spec.step_time or load_table()
        self.base_profile = parse_profile(spec.acceptance, spec.k) if spec.k else None
        self.profile = self.base_profile
        if self.kind == "vllm":
            self.metrics: Any = metrics_vllm.VllmMetrics(
                self.model_name, spec.dp, spec.k, max_model_len=spec.max_model_len
            )
        else:
            self.metrics = metrics_sglang.SglangMetrics(
                self.model_name,
                spec.dp,
                spec.k,
                custom_labels=spec.custom_labels,
                kv_capacity_tokens=spec.kv_capacity_tokens,
                max_running_requests=spec.max_num_seqs,
            )
        seed = spec.seed
        self.engines = [
            SimEngine(i, self._settings(), self.clock, self.metrics, seed=None if seed is None else seed + i)
            for i in range(spec.dp)
        ]
        self._lock = threading.Lock()
        self._next_event = 0
        self._offered: float | None = None
        self._down_until: float | None = None
        self._stop = threading.Event()
        self._runner: threading.Thread | None = None
        self._rr = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for engine in self.engines:
            engine.start()
        self._apply_due_events()
        self._runner = threading.Thread(target=self._run_scenario, name="sim-scenario", daemon=True)
        self._runner.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the scenario and every engine: all are told first, then joined against one deadline, so a
        slow box waits `timeout` at most, not `timeout` per thread."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        for engine in self.engines:
            engine.request_stop()
        if self._runner is not None:
            self._runner.join(timeout=max(0.0, deadline - time.monotonic()))
        for engine in self.engines:
            engine.join(deadline)

    # ------------------------------------------------------------------ serving
    @property
    def down(self) -> bool:
        return self._down_until is not None

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        streaming: bool = False,
        custom_labels: Mapping[str, str] | None = None,
        greedy_seed: int | None = None,
    ) -> tuple[SimEngine, SimRequest]:
        """Hand a request to the least-loaded engine (round-robin among equals). `greedy_seed`: a temperature-0
        request, whose acceptance repeats for the same seed (prompt) and profile when `repeatable_greedy` is on."""
        request = SimRequest(
            prompt_tokens,
            max_tokens,
            streaming=streaming,
            custom_labels=custom_labels,
            greedy_seed=greedy_seed if self.spec.repeatable_greedy else None,
        )
        with self._lock:
            self._rr += 1
            order = self.engines[self._rr % len(self.engines) :] + self.engines[: self._rr % len(self.engines)]
            engine = min(order, key=lambda e: e.load)
        engine.submit(request)
        return engine, request

    def render_metrics(self, names: Sequence[str] | None = None) -> bytes:
        return self.metrics.render(names)

    def status(self) -> dict[str, Any]:
        engines: list[EngineStatus] = [e.status() for e in self.engines]
        return {
            "simulator": True,
            "engine": self.kind,
            "version": f"{self.version}-simulated",
            "model_name": self.model_name,
            "k": self.k,
            "acceptance_rate": self.profile.acceptance_rate() if self.profile else None,
            "time_scale": self.clock.time_scale,
            "sim_time": self.clock.now(),
            "offered_concurrency": self._offered or 0.0,
            "down": self.down,
            "engines": [dataclasses.asdict(e) for e in engines],
        }

    # ------------------------------------------------------------------ scenario
    def apply(self, event: Event) -> None:
        p = event.params
        log.info("simulated %s: t=%.0fs %s %s", self.kind, self.clock.now(), event.type, dict(p) or "")
        if event.type == "acceptance":
            if self.base_profile is None:
                log.warning("simulated %s: acceptance event ignored, speculation is off", self.kind)
                return
            rate = p["rate"] if "rate" in p else min(1.0, self.base_profile.acceptance_rate() * p["factor"])
            self._set_profile(self.base_profile.with_rate(rate))
        elif event.type == "model_bump":
            self.model_name = p["model_name"]
            if self.base_profile is not None and "acceptance_factor" in p:
                self.profile = self.base_profile.with_rate(
                    min(1.0, self.base_profile.acceptance_rate() * p["acceptance_factor"])
                )
            self._restart()
        elif event.type == "restart":
            self._restart()
        elif event.type == "outage":
            self._down_until = self.clock.now() + p["duration"]
            for engine in self.engines:
                engine.restart(paused=True)
        # "load" events are read continuously through Scenario.concurrency_at()

    def _run_scenario(self) -> None:
        while not self._stop.wait(_SCENARIO_POLL_REAL_SECONDS):
            self._apply_due_events()

    def _apply_due_events(self) -> None:
        now = self.clock.now()
        if self._down_until is not None and now >= self._down_until:
            self._down_until = None
            log.info("simulated %s: outage over, engines restart", self.kind)
            self._restart()
        events = self.spec.scenario.events
        while self._next_event < len(events) and events[self._next_event].at <= now:
            self.apply(events[self._next_event])
            self._next_event += 1
        offered = self.spec.scenario.concurrency_at(now)
        if self.down:
            offered = 0.0
        if offered != self._offered:
            self._offered = offered
            total = round(offered)
            n = len(self.engines)
            for i, engine in enumerate(self.engines):
                engine.set_offered_concurrency(total // n + (1 if i < total % n else 0))

    def _set_profile(self, profile: AcceptanceProfile) -> None:
        self.profile = profile
        for engine in self.engines:
            engine.set_profile(profile)

    def _restart(self) -> None:
        for engine in self.engines:
            engine.restart(self._settings())
        self.metrics.reset(model_name=self.model_name)

    def _settings(self) -> EngineSettings:
        return EngineSettings(
            model_name=self.model_name,
            step_time=self._step_time,
            k=self.k,
            profile=self.profile,
            max_num_seqs=self.spec.max_num_seqs,
            kv_capacity_tokens=self.spec.kv_capacity_tokens,
        )
