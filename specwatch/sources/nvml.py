"""The GPU source: NVML fields and Hopper GPM activity per GPU, and the route -> GPU mapping.

Absent beats wrong (docs/architecture.md, Isolation). NVML is initialised and every GPU handle obtained once;
each field of `gpu_fields.py` is queried on its own, and a field NVML answers NotSupported or NoPermission for is left
out (never 0, never NaN). A GPU that is lost is exported as `gpu_up 0` while the others carry on. Without
NVML (no driver, a CPU host, no nvidia-ml-py) the source reports `nvml_up` False, logs one line, and tries
to load it again every minute, so a driver loaded later is picked up.

GPM (Hopper and later): two sample buffers per GPU are allocated once; every cycle takes one sample and NVML
computes each metric between it and the previous cycle's, i.e. over one evaluation interval. Each metric's
own return code is checked. In MIG mode GPM is left out: per-GPU-instance values would need a label that
GPU metrics do not carry (nvmlGpmMigSampleGet is the way in if that is ever wanted).

Imports only the standard library, pynvml (lazily) and specwatch leaf modules, so it runs wherever pynvml does.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from specwatch.config import GpuConfig, RouteConfig
from specwatch.snapshot import GpuSample
from specwatch.sources import procmap
from specwatch.sources.gpu_fields import GPM_FIELDS, NVML_FIELDS, GpmField, NvmlField

log = logging.getLogger(__name__)

INIT_RETRY_SECONDS = 60.0
ROUTE_MAP_REFRESH_SECONDS = 60.0
ROUTE_MAP_RETRY_SECONDS = 10.0  # while a route maps to no GPU yet (its engine may still be starting)

# NVML return codes by meaning; names resolved against the bindings (a fake NVML provides the same names).
_ABSENT_ERRORS = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")
_LOST_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_NOT_FOUND", "NVML_ERROR_RESET_REQUIRED")
_LIBRARY_DOWN_ERRORS = (
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
)


class _GpuLost(Exception):
    pass


class _LibraryDown(Exception):
    pass


def _codes(nvml: Any, names: Iterable[str]) -> frozenset[int]:
    return frozenset(getattr(nvml, n) for n in names if hasattr(nvml, n))


@dataclass(frozen=True)
class _BoundField:
    """A field table row resolved against the loaded bindings."""

    metric: str
    call: Callable[..., Any]
    call_name: str
    args: tuple[Any, ...]
    attribute: str
    scale: float

    @property
    def call_key(self) -> tuple[str, tuple[Any, ...]]:
        return self.call_name, self.args


def _bind_fields(nvml: Any, rows: Iterable[NvmlField]) -> tuple[_BoundField, ...]:
    bound = []
    for row in rows:
        fn = getattr(nvml, row.call, None)
        missing = [a for a in row.args if not hasattr(nvml, a)]
        if fn is None or missing:
            lacking = ([row.call] if fn is None else []) + missing
            log.debug("GPU field %s off: these bindings lack %s", row.metric, ", ".join(lacking))
            continue
        bound.append(
            _BoundField(row.metric, fn, row.call, tuple(getattr(nvml, a) for a in row.args), row.attribute, row.scale)
        )
    return tuple(bound)


class _Calls:
    """Runs NVML calls for one GPU, sorting failures into absent / lost / library down / other.

    Other failures are logged once per field until that field answers again, so a flapping field cannot flood
    the log and a recovered one is logged again if it fails anew.
    """

    def __init__(self, nvml: Any, gpu_index: int) -> None:
        self._nvml = nvml
        self._gpu = gpu_index
        self._absent = _codes(nvml, _ABSENT_ERRORS)
        self._lost = _codes(nvml, _LOST_ERRORS)
        self._down = _codes(nvml, _LIBRARY_DOWN_ERRORS)
        self._failing: dict[str, str] = {}

    def __call__(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = fn(*args)
        except self._nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in self._lost:
                raise _GpuLost(f"{what}: {exc}") from exc
            if code in self._down:
                raise _LibraryDown(f"{what}: {exc}") from exc
            self._failed(what, str(exc), logging.DEBUG if code in self._absent else logging.WARNING)
            return None
        except Exception as exc:  # a bug in the bindings or a fake must not stop the other fields
            self._failed(what, f"{type(exc).__name__}: {exc}", logging.WARNING)
            return None
        if self._failing:
            self._failing.pop(what, None)
        return result

    def _failed(self, what: str, message: str, level: int) -> None:
        if self._failing.get(what) != message:
            self._failing[what] = message
            log.log(level, "GPU %d: %s failed, left out: %s", self._gpu, what, message)


class _Gpm:
    """GPM sampling for one GPU: two buffers allocated once and used in turn, one metrics request reused."""

    def __init__(self, nvml: Any, handle: Any, rows: tuple[GpmField, ...]) -> None:
        self._nvml = nvml
        self._handle = handle
        self._rows = tuple(r for r in rows if hasattr(nvml, r.metric_id))
        self._success = nvml.NVML_SUCCESS
        self._buffers: list[Any] = []
        try:
            for _ in range(2):
                self._buffers.append(nvml.nvmlGpmSampleAlloc())
        except Exception:
            self.close()
            raise
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._rows)
        for i, row in enumerate(self._rows):
            request.metrics[i].metricId = getattr(nvml, row.metric_id)
        self._request = request
        self._current = 0
        self._have_previous = False
        self._failing_metrics: set[str] = set()

    def sample(self, calls: _Calls) -> dict[str, float]:
        """Take this cycle's sample; values over the interval since the previous one (none on the first)."""
        buffer = self._buffers[self._current]
        if calls("GPM sample", self._nvml.nvmlGpmSampleGet, self._handle, buffer) is None:
            self._have_previous = False
            return {}
        values: dict[str, float] = {}
        if self._have_previous:
            self._request.sample1 = self._buffers[1 - self._current]
            self._request.sample2 = buffer
            if calls("GPM metrics", self._nvml.nvmlGpmMetricsGet, self._request) is not None:
                values = self._read_metrics()
        self._current = 1 - self._current
        self._have_previous = True
        return values

    def _read_metrics(self) -> dict[str, float]:
        values = {}
        for i, row in enumerate(self._rows):
            metric = self._request.metrics[i]
            if metric.nvmlReturn != self._success:
                if row.metric not in self._failing_metrics:  # some ids answer non-zero on some GPUs: log once
                    self._failing_metrics.add(row.metric)
                    log.info("GPM %s returned NVML error %s; left out", row.metric_id, metric.nvmlReturn)
                continue
            value = metric.value / 100.0  # NVML gives percent
            if math.isfinite(value):
                values[row.metric] = min(max(value, 0.0), 1.0)  # rounding can overshoot 100% slightly
        return values

    def reset(self) -> None:
        """Forget the previous sample (after a gap, the next interval would span it)."""
        self._have_previous = False

    def close(self) -> None:
        for buffer in self._buffers:
            try:
                self._nvml.nvmlGpmSampleFree(buffer)
            except Exception as exc:  # closing must finish for the other GPUs
                log.debug("nvmlGpmSampleFree: %s", exc)
        self._buffers = []


class _Gpu:
    """One GPU: its handle and static facts, read once, and its per-cycle sampling."""

    def __init__(
        self, nvml: Any, index: int, driver: str, fields: tuple[_BoundField, ...], gpm_rows: tuple[GpmField, ...]
    ) -> None:
        self.index = index
        self._nvml = nvml
        self._driver = driver
        self._fields = fields
        self._gpm_rows = gpm_rows
        self._calls = _Calls(nvml, index)
        self.handle: Any = None
        self.uuid = ""
        self.name = ""
        self.gpm: _Gpm | None = None
        self._lost = False
        try:
            self._open()
        except _GpuLost as exc:
            self._went_down(exc)

    def _open(self) -> None:
        """Handle, facts and GPM, read once; a GPU lost already at start is retried each cycle until it answers.

        Raises _GpuLost while no handle can be had; _LibraryDown propagates."""
        handle = self._calls("handle", self._nvml.nvmlDeviceGetHandleByIndex, self.index)
        if handle is None:
            raise _GpuLost("no handle")
        self.uuid = self._text(self._calls("UUID", self._nvml.nvmlDeviceGetUUID, handle))
        self.name = self._text(self._calls("name", self._nvml.nvmlDeviceGetName, handle))
        self.gpm = self._open_gpm(handle)
        self.handle = handle

    def _went_down(self, exc: Exception) -> None:
        if not self._lost:
            self._lost = True
            log.warning("GPU %d lost (%s): exporting gpu_up 0 for it, the other GPUs carry on", self.index, exc)
        if self.gpm is not None:
            self.gpm.reset()

    @staticmethod
    def _text(value: Any) -> str:
        if isinstance(value, bytes):  # older bindings return bytes
            return value.decode("utf-8", "replace")
        return "" if value is None else str(value)

    def _open_gpm(self, handle: Any) -> _Gpm | None:
        nvml, rows = self._nvml, self._gpm_rows
        if not rows or not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return None
        mig = self._calls("MIG mode", getattr(nvml, "nvmlDeviceGetMigMode", lambda h: None), handle)
        if mig and mig[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            log.info("GPU %d is in MIG mode: GPM activity metrics are left out for it", self.index)
            return None
        support = self._calls("GPM support", nvml.nvmlGpmQueryDeviceSupport, handle)
        if support is None or not support.isSupportedDevice:
            log.info(
                "GPU %d (%s) has no GPM (before Hopper): SM/tensor/DRAM activity metrics are left out",
                self.index,
                self.name,
            )
            return None
        try:
            return _Gpm(nvml, handle, rows)
        except Exception as exc:
            log.warning("GPU %d: GPM setup failed, activity metrics left out: %s", self.index, exc)
            return None

    def sample(self) -> GpuSample:
        """Never raises _GpuLost: a lost GPU comes back as up=False. _LibraryDown propagates."""
        try:
            if self.handle is None:
                self._open()
            fields = self._read_fields()
            if self.gpm is not None:
                fields.update(self.gpm.sample(self._calls))
            processes = self._calls("compute processes", self._nvml.nvmlDeviceGetComputeRunningProcesses, self.handle)
        except _GpuLost as exc:
            self._went_down(exc)
            return GpuSample(index=self.index, up=False, uuid=self.uuid, name=self.name, driver=self._driver)
        if self._lost:
            self._lost = False
            log.info("GPU %d answers again", self.index)
        pids = tuple(sorted({p.pid for p in processes or () if getattr(p, "pid", None) is not None}))
        return GpuSample(
            index=self.index, up=True, uuid=self.uuid, name=self.name, driver=self._driver, fields=fields, pids=pids
        )

    def _read_fields(self) -> dict[str, float]:
        results: dict[tuple[str, tuple[Any, ...]], Any] = {}
        values: dict[str, float] = {}
        for field in self._fields:
            key = field.call_key
            if key not in results:  # rows sharing a call (memory used/total) cost one NVML call
                results[key] = self._calls(field.metric, field.call, self.handle, *field.args)
            result = results[key]
            if result is None:
                continue
            try:
                value = float(getattr(result, field.attribute) if field.attribute else result) * field.scale
            except (AttributeError, TypeError, ValueError):
                continue
            if math.isfinite(value) and value >= 0:
                values[field.metric] = value
        return values

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
            self.gpm = None


class GpuSource:
    """All GPUs of this host through one NVML session. `sample()` and `route_gpus()` never raise."""

    def __init__(
        self,
        nvml: Any | None,
        *,
        required: bool = False,
        import_error: str = "",
        clock: Callable[[], float] = time.monotonic,
        proc_root: str = "/proc",
    ) -> None:
        self._nvml = nvml
        self._required = required  # gpu.enabled: true (not auto): a missing NVML is worth a warning
        self._import_error = import_error
        self._clock = clock
        self._proc_root = proc_root
        self._gpus: tuple[_Gpu, ...] = ()
        self._loaded = False
        self._next_init = -math.inf
        self._reported_down = False
        self._pid_gpus: dict[int, set[int]] = {}
        self._route_cache: dict[tuple[str, str], tuple[tuple[int, ...], float]] = {}
        self._route_map_failing: set[str] = set()

    # ------------------------------------------------------------------ sampling
    def sample(self, now: float) -> tuple[bool | None, tuple[GpuSample, ...]]:
        """(nvml_up, one GpuSample per GPU). nvml_up is False while NVML cannot be loaded.

        `now` (the daemon's wall clock) is not needed: load retries run on the injected monotonic clock, so a
        clock step cannot stall them, and NVML times GPM intervals itself."""
        monotonic_now = self._clock()
        try:
            if not self._loaded and not self._load(monotonic_now):
                return False, ()
            samples = tuple(gpu.sample() for gpu in self._gpus)
        except _LibraryDown as exc:
            self._unload()
            self._down(monotonic_now, f"NVML stopped answering ({exc})")
            return False, ()
        except Exception:  # a bug here must cost the GPU metrics, never the daemon's loop
            log.exception("GPU sampling failed")
            return self._loaded, ()
        pid_gpus: dict[int, set[int]] = {}
        for s in samples:
            for pid in s.pids:
                pid_gpus.setdefault(pid, set()).add(s.index)
        self._pid_gpus = pid_gpus
        return True, samples

    def _load(self, now: float) -> bool:
        if self._nvml is None:
            self._down(now, self._import_error or "pynvml is not importable")
            return False
        if now < self._next_init:
            return False
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self._down(now, f"NVML did not load: {exc}")
            return False
        gpus: list[_Gpu] = []
        try:
            driver = _Gpu._text(nvml.nvmlSystemGetDriverVersion())
            fields = _bind_fields(nvml, NVML_FIELDS)
            for index in range(nvml.nvmlDeviceGetCount()):
                gpus.append(_Gpu(nvml, index, driver, fields, GPM_FIELDS))
        except Exception as exc:
            for gpu in gpus:
                gpu.close()
            self._shutdown()
            self._down(now, f"NVML loaded but could not list the GPUs: {exc}")
            return False
        self._gpus = tuple(gpus)
        self._loaded = True
        self._reported_down = False
        log.info(
            "NVML loaded: driver %s, %d GPU(s): %s",
            driver,
            len(self._gpus),
            ", ".join(f"{g.index} {g.name} (GPM {'on' if g.gpm else 'off'})" for g in self._gpus) or "none",
        )
        return True

    def _down(self, now: float, reason: str) -> None:
        self._next_init = now + INIT_RETRY_SECONDS
        if self._reported_down:
            log.debug("GPU metrics still off: %s", reason)
            return
        self._reported_down = True
        retry = f"; retrying every {INIT_RETRY_SECONDS:g}s" if self._nvml is not None else ""
        log.log(
            logging.WARNING if self._required else logging.INFO,
            "GPU metrics off: %s. Exporting specwatch_nvml_up 0%s; everything else runs on",
            reason,
            retry,
        )

    def _unload(self) -> None:
        for gpu in self._gpus:
            gpu.close()
        self._gpus = ()
        self._pid_gpus = {}
        if self._loaded:
            self._shutdown()
        self._loaded = False

    def _shutdown(self) -> None:
        if self._nvml is None:
            return
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # already gone; nothing left to release
            log.debug("nvmlShutdown: %s", exc)

    def close(self) -> None:
        self._unload()

    # ------------------------------------------------------------------ route -> GPU mapping
    def route_gpus(self, route_cfg: RouteConfig) -> tuple[int, ...]:
        """The route's GPUs: `gpus:` from its config, else the GPUs running processes of the engine behind its
        port (cached; refreshed every minute, every 10 s while none is found)."""
        if route_cfg.gpus is not None:
            return tuple(route_cfg.gpus)
        key = (route_cfg.name, route_cfg.url)
        now = self._clock()
        cached = self._route_cache.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        try:
            gpus = self._map_url(route_cfg.url)
            self._route_map_failing.discard(route_cfg.name)
        except Exception as exc:  # /proc surprises must not stop the loop
            if route_cfg.name not in self._route_map_failing:
                self._route_map_failing.add(route_cfg.name)
                log.warning("route %s: GPU auto-mapping failed (%s); set gpus: on the route", route_cfg.name, exc)
            gpus = ()
        if gpus != (cached[0] if cached else ()):  # log changes only: a CPU host would log "none" forever
            log.info(
                "route %s: mapped to GPU(s) %s through the processes behind %s",
                route_cfg.name,
                ", ".join(map(str, gpus)) or "none",
                route_cfg.url,
            )
        self._route_cache[key] = (gpus, now + (ROUTE_MAP_REFRESH_SECONDS if gpus else ROUTE_MAP_RETRY_SECONDS))
        return gpus

    def _map_url(self, url: str) -> tuple[int, ...]:
        if not self._pid_gpus:
            return ()
        parsed = urlparse(url)
        host = parsed.hostname or ""
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if not procmap.is_local_host(host):
            return ()
        inodes = procmap.listening_inodes(port, host, self._proc_root)
        serving = procmap.pids_serving(inodes, self._pid_gpus, self._proc_root)
        return tuple(sorted({gpu for pid in serving for gpu in self._pid_gpus[pid]}))


def make_gpu_source(gpu_cfg: GpuConfig, nvml: Any = None, **kwargs: Any) -> GpuSource | None:
    """The daemon's entry point: None when `gpu.enabled` is false. `nvml` is the pynvml module (imported here,
    lazily, when not given) or a stand-in such as tests' FakeNvml; kwargs go to GpuSource."""
    if gpu_cfg.enabled == "false":
        return None
    import_error = ""
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError as exc:
            import_error = f"the nvidia-ml-py package (module pynvml) is not installed: {exc}"
    return GpuSource(nvml, required=gpu_cfg.enabled == "true", import_error=import_error, **kwargs)
