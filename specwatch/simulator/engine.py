"""One simulated engine (a vLLM DP engine or an SGLang DP rank): continuous batching on a simulated clock.

Every step the engine admits waiting requests up to `max_num_seqs`, runs one decode step over the whole
running batch, and charges it the step-time model's cost for that batch (plus prefill for the newcomers).
With speculation on (k > 0) each running request drafts k tokens and accepts X of them (drawn from the
acceptance profile), emitting X + 1 tokens; with k == 0 it emits one.

Cost: a step is O(batch) arithmetic, and the thread sleeps only when simulated time has run ahead of
`clock.now()` by more than a millisecond of real time, so many short steps run back to back between
sleeps; a CPU-starved engine simply falls behind real time, its simulated accounting stays exact.

Nothing here knows a metric format: the engine reports steps and finished requests to a `Recorder`
(`metrics_vllm`, `metrics_sglang`), and streams tokens to waiting HTTP handlers through `SimRequest`.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from specwatch.simulator.clock import SimClock
from specwatch.simulator.speculation import AcceptanceProfile, AcceptanceSampler
from specwatch.simulator.steptime import StepTimeModel, step_seconds

_MIN_SLEEP_REAL_SECONDS = 0.001  # below this, run the next step now rather than pay a thread wake-up
_IDLE_POLL_REAL_SECONDS = 0.05
_request_ids = itertools.count(1)


@dataclass
class EngineSettings:
    model_name: str
    step_time: StepTimeModel
    k: int = 0  # draft tokens per step; 0 = speculation off
    profile: AcceptanceProfile | None = None  # required when k > 0
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 400_000
    prefill_seconds_per_token: float = 2.0e-5
    internal_prompt_tokens: tuple[int, int] = (128, 1024)  # uniform range for the built-in load generator
    internal_output_tokens: tuple[int, int] = (64, 512)
    internal_custom_labels: tuple[Mapping[str, str], ...] = ()  # cycled over built-in requests

    def __post_init__(self) -> None:
        if self.k > 0 and (self.profile is None or self.profile.k != self.k):
            raise ValueError(f"speculation with k={self.k} needs an acceptance profile of {self.k} positions")


class SimRequest:
    """One request. External requests (HTTP) are streamed: the engine bumps `generated` and sets `ready`."""

    __slots__ = (
        "id",
        "prompt_tokens",
        "max_tokens",
        "internal",
        "streaming",
        "custom_labels",
        "generated",
        "verify_steps",
        "arrival",
        "scheduled_at",
        "first_token_at",
        "finished_at",
        "finish_reason",
        "ready",
        "greedy_seed",
        "sampler",
        "spec_draft_tokens",
        "spec_accepted_tokens",
        "spec_histogram",
    )

    def __init__(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        internal: bool = False,
        streaming: bool = False,
        custom_labels: Mapping[str, str] | None = None,
        greedy_seed: int | None = None,
    ) -> None:
        self.id = next(_request_ids)
        self.prompt_tokens = max(1, int(prompt_tokens))
        self.max_tokens = max(1, int(max_tokens))
        self.internal = internal
        self.streaming = streaming
        self.custom_labels = custom_labels  # SGLang's x-custom-labels (e.g. {"route": "chat"})
        self.generated = 0
        self.verify_steps = 0
        self.arrival = 0.0  # simulated times
        self.scheduled_at: float | None = None  # left the waiting queue
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.finish_reason = ""  # "length" | "stop" | "abort"
        self.ready = None if internal else threading.Event()
        # Greedy (temperature 0) requests: acceptance drawn from a stream seeded by the prompt, so the same
        # prompt accepts the same way under the same profile, as a real (target, drafter) pair does.
        self.greedy_seed = greedy_seed
        self.sampler: AcceptanceSampler | None = None
        self.spec_draft_tokens = 0  # this request's own speculative decoding (the per-request metrics)
        self.spec_accepted_tokens = 0
        self.spec_histogram: list[int] = []  # index j: verify steps that accepted exactly j drafts

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


@dataclass
class StepRecord:
    """What one step did, summed over the batch; handed to the recorder."""

    now: float  # simulated time at the end of the step
    duration: float
    running: int
    waiting: int
    kv_usage: float
    decoding: int = 0  # running requests past their prefill (vLLM times the step once for each)
    kv_tokens: int = 0  # tokens in the running requests' KV cache after the step
    prompt_tokens: int = 0  # prefilled this step
    emitted_tokens: int = 0
    drafts: int = 0  # requests that verified drafts this step
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class Recorder(Protocol):
    def on_step(self, engine: int, step: StepRecord) -> None: ...

    def on_finish(self, engine: int, request: SimRequest, now: float) -> None: ...


@dataclass(frozen=True)
class EngineStatus:
    index: int
    sim_time: float
    running: int
    waiting: int
    kv_usage: float
    generated_tokens: int  # since the engine (re)started
    steps: int
    busy_seconds: float  # simulated time spent stepping
    batch_seconds: float  # integral of the running batch over simulated time (mean batch = / busy_seconds)
    offered_concurrency: float


def _greedy_sampler(profile: AcceptanceProfile | None, seed: int) -> AcceptanceSampler | None:
    """A greedy prompt's own sampler: the engine's profile scaled by a factor of the prompt (0.85-1.10, some
    prompts are easier to draft than others) and a random stream seeded by it."""
    if profile is None:
        return None
    rng = random.Random(seed)
    return AcceptanceSampler(profile.scaled(0.85 + 0.25 * rng.random()), rng)


class SimEngine:
    def __init__(
        self, index: int, settings: EngineSettings, clock: SimClock, recorder: Recorder, seed: int | None = None
    ) -> None:
        self.index = index
        self.clock = clock
        self.recorder = recorder
        self._settings = settings
        self._step_costs: dict[tuple[int, int], float] = {}
        self._label_cycle = itertools.count()
        self._rng = random.Random(seed)
        self._sampler = self._new_sampler(settings.profile)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self._internal_in_flight = 0
        self._offered = 0.0
        self._paused = False
        self._t = 0.0
        self._reset_stats()

    # ------------------------------------------------------------------ control (any thread)
    @property
    def settings(self) -> EngineSettings:
        return self._settings

    def start(self) -> None:
        self._t = self.clock.now()
        self._thread = threading.Thread(target=self._loop, name=f"sim-engine-{self.index}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        self.join(time.monotonic() + timeout)

    def request_stop(self) -> None:
        """Tell the step loop to end, without waiting for it (stop many engines, then join them)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, deadline: float) -> None:
        """Wait for the step loop until `deadline` (time.monotonic), then abort the requests left."""
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.abort_all()

    def submit(self, request: SimRequest) -> None:
        with self._cond:
            request.arrival = max(self._t, self.clock.now())
            self._waiting.append(request)
            self._cond.notify()

    def set_offered_concurrency(self, concurrency: float) -> None:
        """Closed-loop built-in load: keep this many internal requests in flight."""
        with self._cond:
            self._offered = max(0.0, float(concurrency))
            self._cond.notify()

    def set_profile(self, profile: AcceptanceProfile) -> None:
        with self._cond:
            if self._settings.k == 0:
                return
            if profile.k != self._settings.k:
                raise ValueError(f"engine {self.index}: profile has {profile.k} positions, k is {self._settings.k}")
            self._settings.profile = profile
            self._sampler = self._new_sampler(profile)

    def restart(self, settings: EngineSettings | None = None, *, paused: bool = False) -> None:
        """Abort everything in flight and start from zero (new settings if given), like a process restart."""
        with self._cond:
            self._abort_locked()
            if settings is not None:
                self._settings = settings
                self._step_costs.clear()
                self._sampler = self._new_sampler(settings.profile)
            self._reset_stats()
            self._paused = paused
            self._t = self.clock.now()
            self._cond.notify()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._t = self.clock.now()
            self._cond.notify()

    def abort_all(self) -> None:
        with self._cond:
            self._abort_locked()

    def cancel(self, request: SimRequest) -> None:
        """The client went away: drop the request wherever it is."""
        with self._cond:
            if request in self._running:
                self._running.remove(request)
            elif request in self._waiting:
                self._waiting.remove(request)
            else:
                return
            self._finish(request, "abort")

    def status(self) -> EngineStatus:
        with self._cond:
            return EngineStatus(
                self.index,
                self._t,
                len(self._running),
                len(self._waiting),
                self._kv_usage(),
                self._generated,
                self._steps,
                self._busy,
                self._batch_integral,
                self._offered,
            )

    @property
    def load(self) -> int:
        """Requests in flight, for the dispatcher."""
        return len(self._running) + len(self._waiting)

    # ------------------------------------------------------------------ the step loop (engine thread)
    def advance(self, until: float) -> None:
        """Run steps back to back on the calling thread until simulated time `until`, ignoring the clock.

        For tests and offline use, on an engine whose thread was never started.
        """
        while True:
            with self._cond:
                planned = self._plan_step()
                if planned is None:
                    self._t = max(self._t, until)
                    return
                end, duration, admitted = planned
                self._step(end, duration, admitted)
                if self._t >= until:
                    return

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if self._paused:
                    self._cond.wait(_IDLE_POLL_REAL_SECONDS)
                    continue
                planned = self._plan_step()
                if planned is None:
                    self._t = max(self._t, self.clock.now())  # idle: simulated time just passes
                    self._cond.wait(_IDLE_POLL_REAL_SECONDS)
                    continue
                end, duration, admitted = planned
            lag = self.clock.real_seconds(end - self.clock.now())
            if lag > _MIN_SLEEP_REAL_SECONDS and self._stop.wait(lag):
                return
            with self._cond:
                if self._paused or not self._running:  # restarted or cancelled while we slept
                    continue
                self._step(end, duration, admitted)

    def _plan_step(self) -> tuple[float, float, list[SimRequest]] | None:
        """Admit what fits and price the next step: (end time, duration, newly admitted), None when idle."""
        self._top_up_internal_load()
        admitted = self._admit()
        if not self._running:
            return None
        settings = self._settings
        duration = self._step_cost(len(self._running), settings.k)
        if admitted:
            duration += settings.prefill_seconds_per_token * sum(r.prompt_tokens for r in admitted)
        return self._t + duration, duration, admitted

    def _step_cost(self, batch: int, k: int) -> float:
        key = (batch, k)
        cost = self._step_costs.get(key)
        if cost is None:  # the table interpolation is pure: price each (batch, k) once
            cost = self._step_costs[key] = step_seconds(self._settings.step_time, batch, k)
        return cost

    def _admit(self) -> list[SimRequest]:
        admitted = []
        limit = self._settings.max_num_seqs
        while self._waiting and len(self._running) < limit:
            req = self._waiting.popleft()
            req.scheduled_at = self._t
            self._running.append(req)
            admitted.append(req)
        return admitted

    def _top_up_internal_load(self) -> None:
        lo_p, hi_p = self._settings.internal_prompt_tokens
        lo_o, hi_o = self._settings.internal_output_tokens
        while self._internal_in_flight < round(self._offered):
            labels = self._settings.internal_custom_labels
            req = SimRequest(
                self._rng.randint(lo_p, hi_p),
                self._rng.randint(lo_o, hi_o),
                internal=True,
                custom_labels=labels[next(self._label_cycle) % len(labels)] if labels else None,
            )
            req.arrival = self._t
            self._waiting.append(req)
            self._internal_in_flight += 1

    def _step(self, end: float, duration: float, admitted: list[SimRequest]) -> None:
        settings, k, sampler = self._settings, self._settings.k, self._sampler
        fresh = {id(r) for r in admitted}
        rec = StepRecord(
            now=end,
            duration=duration,
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=0.0,
            decoding=len(self._running) - len(admitted),
            prompt_tokens=sum(r.prompt_tokens for r in admitted),
            accepted_per_pos=[0] * k,
        )
        finished = []
        for req in self._running:
            if id(req) in fresh or k == 0 or sampler is None:
                emitted = 1  # a prefill (or plain decode) step samples one token and verifies nothing
            else:
                if req.greedy_seed is not None and req.sampler is None:
                    req.sampler = _greedy_sampler(settings.profile, req.greedy_seed)
                accepted = (req.sampler or sampler).draw()
                emitted = accepted + 1
                req.verify_steps += 1
                req.spec_draft_tokens += k
                req.spec_accepted_tokens += accepted
                if len(req.spec_histogram) <= k:
                    req.spec_histogram.extend([0] * (k + 1 - len(req.spec_histogram)))
                req.spec_histogram[accepted] += 1
                rec.drafts += 1
                rec.draft_tokens += k
                rec.accepted_tokens += accepted
                for j in range(accepted):
                    rec.accepted_per_pos[j] += 1
            emitted = min(emitted, req.max_tokens - req.generated)
            if req.first_token_at is None:
                req.first_token_at = end
            req.generated += emitted
            rec.emitted_tokens += emitted
            if req.generated >= req.max_tokens:
                finished.append(req)
            if req.ready is not None:
                req.ready.set()
        self._t = end
        self._steps += 1
        self._busy += duration
        self._batch_integral += duration * len(self._running)
        self._generated += rec.emitted_tokens
        if finished:
            done = {id(r) for r in finished}
            self._running = [r for r in self._running if id(r) not in done]
        rec.kv_tokens = self._kv_tokens()
        rec.kv_usage = min(1.0, rec.kv_tokens / settings.kv_capacity_tokens)
        self.recorder.on_step(self.index, rec)
        for req in finished:
            # Internal requests draw their own length, so they end with "stop"; clients ask for max_tokens.
            self._finish(req, "stop" if req.internal else "length")

    # ------------------------------------------------------------------ helpers (lock held)
    def _finish(self, req: SimRequest, reason: str) -> None:
        req.finish_reason = reason
        req.finished_at = self._t
        if req.internal:
            self._internal_in_flight -= 1
        self.recorder.on_finish(self.index, req, self._t)
        if req.ready is not None:
            req.ready.set()

    def _abort_locked(self) -> None:
        for req in list(self._running) + list(self._waiting):
            self._finish(req, "abort")
        self._running.clear()
        self._waiting.clear()
        self._internal_in_flight = 0

    def _kv_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self._running)

    def _kv_usage(self) -> float:
        return min(1.0, self._kv_tokens() / self._settings.kv_capacity_tokens)

    def _reset_stats(self) -> None:
        self._generated = 0
        self._steps = 0
        self._busy = 0.0
        self._batch_integral = 0.0

    def _new_sampler(self, profile: AcceptanceProfile | None) -> AcceptanceSampler | None:
        return AcceptanceSampler(profile, self._rng) if profile is not None else None
