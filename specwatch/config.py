"""Strict YAML configuration: frozen dataclasses, unknown keys are errors, every problem reported at once.

`load_config(path)` returns a `Config` or raises `ConfigError` whose `.problems` lists each problem with its
path (`routes[1].url: not an http(s) URL`). Nothing half-valid is ever returned, so a reload either swaps
the whole config or keeps the old one.
"""

from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

import yaml

from specwatch.probe.prompts import PromptSetError, load_prompt_set  # a leaf module: json and PyYAML only

ENGINE_KINDS = ("vllm", "sglang", "trtllm", "llamacpp", "auto", "sglang_request_log")  # the last reads files
GPU_MODES = ("auto", "true", "false")
OTLP_PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_CONFIG_PATH = "/etc/specwatch/specwatch.yml"
DEFAULT_STATE_DIR = "/var/lib/specwatch"
OTLP_GRPC_MODULE = "opentelemetry.exporter.otlp.proto.grpc"  # optional dependency, only for protocol: grpc

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_ROUTE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


class ConfigError(ValueError):
    """A configuration was rejected; `problems` holds every problem found, each prefixed with its path."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + f"{len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


# --------------------------------------------------------------------------- dataclasses
@dataclass(frozen=True)
class DetectionConfig:
    drop: float = 0.15  # page when acceptance <= (1 - drop) x baseline
    warmup_drafted_tokens: int = 20_000
    warmup_seconds: float = 1800.0
    min_drafted_tokens: int = 2_000  # never page on less evidence than this
    min_duration_seconds: float = 180.0  # the CUSUM excursion must have lasted this long
    cusum_threshold: float = 10.0  # h, in φ-scaled nats (docs/detection.md: how to tune)
    adopt_after_seconds: float = 3600.0  # clean period before a bumped model's own baseline is adopted
    confirm_window_seconds: float = 300.0  # short window that confirms a drop is ongoing and resolves it
    # Evidence is weighed in blocks this long (or up to an idle scrape): long against one request, so a request
    # split over two scrapes does not hide its own correlation. A busy route of short requests can use less,
    # for a faster verdict; the design effect of a block of many whole requests does not depend on its length.
    block_seconds: float = 60.0
    pin_drafted_tokens: int = 1_000_000  # a learned baseline keeps refining until this many tokens ...
    pin_seconds: float = 86400.0  # ... or this long, then it is pinned


@dataclass(frozen=True)
class PinnedBaseline:
    acceptance_ratio: float
    position_acceptance: tuple[float, ...] = ()
    overdispersion: float | None = None  # None: estimated from the warm-up traffic


@dataclass(frozen=True)
class CrossoverEstimateConfig:
    gpu: str = ""  # "" = detect through NVML
    params: float | None = None  # billions of target parameters
    dtype: str = "bf16"
    layers: int | None = None
    hidden_size: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hf_config: str = ""
    context: float | None = None  # None = derive live from KV usage when possible
    draft: str = "eagle"


@dataclass(frozen=True)
class CrossoverConfig:
    kind: str  # "sweep" | "estimate" | "batch_size"
    sweep_file: str = ""
    estimate: CrossoverEstimateConfig | None = None
    batch_size: float | None = None
    hold_seconds: float = 600.0  # the above-crossover flag keeps each state at least this long


PROBE_APIS = ("auto", "openai", "sglang")


@dataclass(frozen=True)
class ProbeConfig:
    """Canary probes of one route (specwatch/probe/): a fixed greedy prompt set sent every `every_seconds`."""

    every_seconds: float = 900.0
    on_change: bool = True  # a round at once when the engine restarts or its model, version or k changes
    prompts: str = "builtin"  # "builtin" or a prompt file (JSON or YAML)
    max_tokens: int = 128
    concurrency: int = 1
    timeout_seconds: float = 60.0  # per request
    api: str = "auto"  # auto: vLLM -> openai, SGLang -> its native /generate
    model: str = "auto"  # auto: the first model of /v1/models (vLLM) or the route's model name


@dataclass(frozen=True)
class Authorization:
    """An `Authorization: <type> <credentials>` header; the credentials inline or read from a file per
    request (so a rotated token is picked up without a reload)."""

    type: str = "Bearer"
    credentials: str = field(default="", repr=False)
    credentials_file: str = ""


@dataclass(frozen=True)
class BasicAuth:
    username: str
    password: str = field(default="", repr=False)
    password_file: str = ""  # read per request, like Authorization.credentials_file


@dataclass(frozen=True)
class TlsConfig:
    ca_file: str = ""  # "" = the system's CAs
    cert_file: str = ""  # client certificate, with key_file
    key_file: str = ""
    server_name: str = ""  # "" = the URL's host; used for SNI and to verify the certificate
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class HttpClientConfig:
    """How engine endpoints are reached, as Prometheus's `http_config` (the subset a scrape uses)."""

    authorization: Authorization | None = None
    basic_auth: BasicAuth | None = None
    tls_config: TlsConfig = field(default_factory=TlsConfig)
    headers: tuple[tuple[str, str], ...] = ()  # (name, value) pairs, in the order given


DEFAULT_HTTP_CLIENT = HttpClientConfig()


@dataclass(frozen=True)
class RouteConfig:
    name: str
    url: str
    engine: str = "auto"
    http: HttpClientConfig = DEFAULT_HTTP_CLIENT
    match: Mapping[str, str] = field(default_factory=dict)
    engines: tuple[str, ...] = ()
    gpus: tuple[int, ...] | None = None  # None = automatic process -> GPU mapping
    version_url: str = ""  # "" = derived from `url` (vLLM /version, SGLang /get_server_info)
    detection: DetectionConfig = field(default_factory=DetectionConfig)
    baseline: PinnedBaseline | None = None
    crossover: CrossoverConfig | None = None
    probe: ProbeConfig | None = None  # None: no canary probes (the default)


@dataclass(frozen=True)
class GpuConfig:
    enabled: str = "auto"  # auto | true | false


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str
    protocol: str = "http/protobuf"
    interval_seconds: float = 60.0
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    interval_seconds: float = 5.0
    state_dir: str = DEFAULT_STATE_DIR
    scrape_timeout_seconds: float = 2.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_series: int = 100_000
    routes: tuple[RouteConfig, ...] = ()
    gpu: GpuConfig = field(default_factory=GpuConfig)
    otlp: OtlpConfig | None = None
    detection: DetectionConfig = field(default_factory=DetectionConfig)

    def route(self, name: str) -> RouteConfig | None:
        return next((r for r in self.routes if r.name == name), None)


# --------------------------------------------------------------------------- the checker
class _Checker:
    """Collects problems instead of raising, so one pass reports everything."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def mapping(
        self, value: Any, path: str, allowed: set[str], required: set[str] | frozenset[str] = frozenset()
    ) -> dict | None:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping, got {type(value).__name__}")
            return None
        for key in value:
            if key not in allowed:
                self.fail(f"{path}.{key}" if path else str(key), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for key in sorted(required - set(value)):
            self.fail(f"{path}.{key}" if path else key, "required")
        return value

    def duration(self, value: Any, path: str, default: float, minimum: float = 0.0) -> float:
        if value is None:
            return default
        seconds = parse_duration(value)
        if seconds is None:
            self.fail(path, f"not a duration like 5s, 10m, 1h: {value!r}")
            return default
        if seconds <= minimum:
            self.fail(path, f"must be more than {minimum:g}s, got {value!r}")
            return default
        return seconds

    def number(
        self,
        value: Any,
        path: str,
        default: float | None,
        lo: float | None = None,
        hi: float | None = None,
        integer: bool = False,
        lo_open: bool = False,
    ) -> Any:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(path, f"must be a {'whole ' if integer else ''}number, got {value!r}")
            return default
        if integer and value != int(value):
            self.fail(path, f"must be a whole number, got {value!r}")
            return default
        if lo is not None and (value < lo or (lo_open and value == lo)):
            self.fail(path, f"must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
            return default
        if hi is not None and value > hi:
            self.fail(path, f"must be <= {hi:g}, got {value!r}")
            return default
        return int(value) if integer else float(value)

    def string(self, value: Any, path: str, default: str = "", choices: tuple[str, ...] | None = None) -> str:
        if value is None:
            return default
        if isinstance(value, bool) and choices and "true" in choices:
            value = "true" if value else "false"
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {value!r}")
            return default
        if choices is not None and value not in choices:
            self.fail(path, f"must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def string_map(self, value: Any, path: str) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping of strings, got {type(value).__name__}")
            return {}
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, (str, int, float)) or isinstance(v, bool):
                self.fail(f"{path}.{k}", f"must be a string, got {v!r}")
            else:
                out[k] = str(v)
        return out


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def parse_duration(value: Any) -> float | None:
    """'5s' -> 5.0, '10m' -> 600.0, 2 -> 2.0 (bare numbers are seconds); None when unparseable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    m = _DURATION_RE.match(value)
    if not m:
        return None
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def _http_url(c: _Checker, value: Any, path: str) -> str:
    if not isinstance(value, str):
        c.fail(path, f"not an http(s) URL: {value!r}")
        return ""
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        c.fail(path, f"not an http(s) URL: {value!r}")
    elif "@" in parsed.netloc:  # the message leaves the URL out: it holds a secret
        c.fail(path, "credentials in the URL are not allowed (and would not be sent); use basic_auth or authorization")
        return ""
    return value


# Headers the client sets itself, or that have their own keys (authorization, basic_auth); as Prometheus
# refuses them in `http_headers`.
_RESERVED_HEADERS = frozenset(
    (
        "authorization",
        "host",
        "accept",
        "accept-encoding",
        "connection",
        "content-length",
        "content-type",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
    )
)
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


def _secret(c: _Checker, d: dict, path: str, inline: str, from_file: str) -> tuple[str, str]:
    """(inline value, file name) of a secret given inline or in a file, never both."""
    if inline in d and from_file in d:
        c.fail(path, f"give {inline} or {from_file}, not both")
    value = d.get(inline)
    if value is not None and not isinstance(value, str):
        c.fail(f"{path}.{inline}", "must be a string")
        value = None
    return value or "", c.string(d.get(from_file), f"{path}.{from_file}")


def _authorization(c: _Checker, raw: Any, path: str) -> Authorization | None:
    d = c.mapping(raw, path, {"type", "credentials", "credentials_file"})
    if d is None:
        return None
    auth_type = c.string(d.get("type"), f"{path}.type", Authorization.type)
    if auth_type.lower() == "basic":
        c.fail(f"{path}.type", "Basic is set with basic_auth, not authorization")
    elif not _HEADER_NAME_RE.match(auth_type):
        c.fail(f"{path}.type", f"must be one word like Bearer, got {auth_type!r}")
    credentials, credentials_file = _secret(c, d, path, "credentials", "credentials_file")
    if not credentials and not credentials_file:
        c.fail(path, "give credentials or credentials_file")
    return Authorization(type=auth_type, credentials=credentials, credentials_file=credentials_file)


def _basic_auth(c: _Checker, raw: Any, path: str) -> BasicAuth | None:
    d = c.mapping(raw, path, {"username", "password", "password_file"}, {"username"})
    if d is None:
        return None
    username = c.string(d.get("username"), f"{path}.username")
    if ":" in username:
        c.fail(f"{path}.username", "must not contain ':'")
    password, password_file = _secret(c, d, path, "password", "password_file")
    return BasicAuth(username=username, password=password, password_file=password_file)


def _tls_config(c: _Checker, raw: Any, path: str) -> TlsConfig:
    d = c.mapping(raw, path, {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify"})
    if d is None:
        return TlsConfig()
    if ("cert_file" in d) != ("key_file" in d):
        c.fail(path, "cert_file and key_file go together")
    skip = d.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        c.fail(f"{path}.insecure_skip_verify", f"must be true or false, got {skip!r}")
        skip = False
    return TlsConfig(
        ca_file=c.string(d.get("ca_file"), f"{path}.ca_file"),
        cert_file=c.string(d.get("cert_file"), f"{path}.cert_file"),
        key_file=c.string(d.get("key_file"), f"{path}.key_file"),
        server_name=c.string(d.get("server_name"), f"{path}.server_name"),
        insecure_skip_verify=skip,
    )


def _headers(c: _Checker, raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    headers = []
    for name, value in c.string_map(raw, path).items():
        if not _HEADER_NAME_RE.match(name):
            c.fail(f"{path}.{name}", "not a valid header name")
        elif name.lower() in _RESERVED_HEADERS:
            c.fail(f"{path}.{name}", "set by specwatch itself (credentials go in authorization or basic_auth)")
        elif not value.isascii() or any(ch in value for ch in "\r\n\0"):
            c.fail(f"{path}.{name}", "the value must be ASCII text on one line")
        else:
            headers.append((name, value))
    return tuple(headers)


_HTTP_CLIENT_KEYS = {"authorization", "basic_auth", "tls_config", "headers"}


def _http_client(c: _Checker, d: dict, path: str, base: HttpClientConfig) -> HttpClientConfig:
    """The HTTP client keys of `d` (a route, or `scrape`); each key given replaces the same key of `base`."""
    prefix = f"{path}." if path else ""
    authorization, basic_auth = base.authorization, base.basic_auth
    if "authorization" in d and "basic_auth" in d:
        c.fail(path or "scrape", "give authorization or basic_auth, not both")
    if "authorization" in d:
        authorization, basic_auth = _authorization(c, d["authorization"], f"{prefix}authorization"), None
    if "basic_auth" in d:
        authorization, basic_auth = None, _basic_auth(c, d["basic_auth"], f"{prefix}basic_auth")
    return HttpClientConfig(
        authorization=authorization,
        basic_auth=basic_auth,
        tls_config=_tls_config(c, d["tls_config"], f"{prefix}tls_config") if "tls_config" in d else base.tls_config,
        headers=_headers(c, d["headers"], f"{prefix}headers") if "headers" in d else base.headers,
    )


def _file_url(c: _Checker, value: Any, path: str) -> str:
    parsed = urlparse(value) if isinstance(value, str) else None
    if parsed is None or parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path:
        c.fail(path, f"not a file:// URL of a directory (engine sglang_request_log): {value!r}")
        return ""
    return value


_DETECTION_KEYS = {
    "drop",
    "warmup_drafted_tokens",
    "warmup_duration",
    "min_drafted_tokens",
    "min_duration",
    "cusum_threshold",
    "adopt_after",
    "confirm_window",
    "pin_drafted_tokens",
    "pin_duration",
    "block",
}


def _detection(c: _Checker, raw: Any, path: str, base: DetectionConfig) -> DetectionConfig:
    d = c.mapping(raw, path, _DETECTION_KEYS)
    if d is None:
        return base
    return DetectionConfig(
        drop=c.number(d.get("drop"), f"{path}.drop", base.drop, lo=0.0, hi=0.95, lo_open=True),
        warmup_drafted_tokens=c.number(
            d.get("warmup_drafted_tokens"),
            f"{path}.warmup_drafted_tokens",
            base.warmup_drafted_tokens,
            lo=0,
            integer=True,
        ),
        warmup_seconds=c.duration(d.get("warmup_duration"), f"{path}.warmup_duration", base.warmup_seconds, -1),
        min_drafted_tokens=c.number(
            d.get("min_drafted_tokens"), f"{path}.min_drafted_tokens", base.min_drafted_tokens, lo=0, integer=True
        ),
        min_duration_seconds=c.duration(d.get("min_duration"), f"{path}.min_duration", base.min_duration_seconds, -1),
        cusum_threshold=c.number(
            d.get("cusum_threshold"), f"{path}.cusum_threshold", base.cusum_threshold, lo=0.0, lo_open=True
        ),
        adopt_after_seconds=c.duration(d.get("adopt_after"), f"{path}.adopt_after", base.adopt_after_seconds, -1),
        confirm_window_seconds=c.duration(
            d.get("confirm_window"), f"{path}.confirm_window", base.confirm_window_seconds
        ),
        pin_drafted_tokens=c.number(
            d.get("pin_drafted_tokens"), f"{path}.pin_drafted_tokens", base.pin_drafted_tokens, lo=0, integer=True
        ),
        pin_seconds=c.duration(d.get("pin_duration"), f"{path}.pin_duration", base.pin_seconds, -1),
        block_seconds=c.duration(d.get("block"), f"{path}.block", base.block_seconds),
    )


def _baseline(c: _Checker, raw: Any, path: str) -> PinnedBaseline | None:
    if raw is None:
        return None
    d = c.mapping(raw, path, {"acceptance_ratio", "position_acceptance", "overdispersion"}, {"acceptance_ratio"})
    if d is None:
        return None
    ratio = c.number(d.get("acceptance_ratio"), f"{path}.acceptance_ratio", None, lo=0.0, hi=1.0, lo_open=True)
    positions: list[float] = []
    raw_pos = d.get("position_acceptance") or []
    if not isinstance(raw_pos, list):
        c.fail(f"{path}.position_acceptance", "must be a list of ratios")
    else:
        for i, p in enumerate(raw_pos):
            v = c.number(p, f"{path}.position_acceptance[{i}]", None, lo=0.0, hi=1.0)
            if v is not None:
                positions.append(v)
    phi = c.number(d.get("overdispersion"), f"{path}.overdispersion", None, lo=1.0)
    if ratio is None:
        return None
    return PinnedBaseline(acceptance_ratio=ratio, position_acceptance=tuple(positions), overdispersion=phi)


_ESTIMATE_KEYS = {
    "gpu",
    "params",
    "dtype",
    "layers",
    "hidden_size",
    "kv_heads",
    "head_dim",
    "hf_config",
    "context",
    "draft",
}


def _crossover(c: _Checker, raw: Any, path: str) -> CrossoverConfig | None:
    if raw is None:
        return None
    d = c.mapping(raw, path, {"sweep", "estimate", "batch_size", "hold"})
    if d is None:
        return None
    present = [k for k in ("sweep", "estimate", "batch_size") if k in d]
    if len(present) != 1:
        c.fail(path, "give exactly one of sweep, estimate, batch_size")
        return None
    kind = present[0]
    hold = c.duration(d.get("hold"), f"{path}.hold", CrossoverConfig.hold_seconds, -1)
    if kind == "sweep":
        f = c.string(d["sweep"], f"{path}.sweep")
        return CrossoverConfig(kind="sweep", sweep_file=f, hold_seconds=hold)
    if kind == "batch_size":
        b = c.number(d["batch_size"], f"{path}.batch_size", None, lo=0.0, lo_open=True)
        return CrossoverConfig(kind="batch_size", batch_size=b, hold_seconds=hold)
    e = c.mapping(d["estimate"], f"{path}.estimate", _ESTIMATE_KEYS)
    if e is None:
        return None
    p = f"{path}.estimate"
    est = CrossoverEstimateConfig(
        gpu=c.string(e.get("gpu"), f"{p}.gpu"),
        params=c.number(e.get("params"), f"{p}.params", None, lo=0.0, lo_open=True),
        dtype=c.string(
            e.get("dtype"),
            f"{p}.dtype",
            CrossoverEstimateConfig.dtype,
            choices=("bf16", "fp16", "fp8", "int8", "int4", "fp4"),
        ),
        layers=c.number(e.get("layers"), f"{p}.layers", None, lo=1, integer=True),
        hidden_size=c.number(e.get("hidden_size"), f"{p}.hidden_size", None, lo=1, integer=True),
        kv_heads=c.number(e.get("kv_heads"), f"{p}.kv_heads", None, lo=1, integer=True),
        head_dim=c.number(e.get("head_dim"), f"{p}.head_dim", None, lo=1, integer=True),
        hf_config=c.string(e.get("hf_config"), f"{p}.hf_config"),
        context=c.number(e.get("context"), f"{p}.context", None, lo=0.0),
        draft=c.string(e.get("draft"), f"{p}.draft", CrossoverEstimateConfig.draft),
    )
    if not re.match(r"^(eagle|eagle3|mtp|ngram|model:\d+(\.\d+)?)$", est.draft):
        c.fail(f"{p}.draft", f"must be eagle, eagle3, mtp, ngram or model:<billions>, got {est.draft!r}")
    return CrossoverConfig(kind="estimate", estimate=est, hold_seconds=hold)


_PROBE_KEYS = {"every", "on_change", "prompts", "max_tokens", "concurrency", "timeout", "api", "model"}


def _probe(c: _Checker, raw: Any, path: str) -> ProbeConfig | None:
    if raw is None:
        return None
    d = c.mapping(raw, path, _PROBE_KEYS)
    if d is None:
        return None
    base = ProbeConfig()
    on_change = d.get("on_change", base.on_change)
    if not isinstance(on_change, bool):
        c.fail(f"{path}.on_change", f"must be true or false, got {on_change!r}")
        on_change = base.on_change
    every = c.duration(d.get("every"), f"{path}.every", base.every_seconds)
    if every < 10.0:
        c.fail(f"{path}.every", f"must be at least 10s (a round sends every prompt), got {d.get('every')!r}")
        every = base.every_seconds
    prompts = c.string(d.get("prompts"), f"{path}.prompts", base.prompts)
    if prompts and "prompts" in d:
        try:
            load_prompt_set(prompts)
        except PromptSetError as exc:
            c.fail(f"{path}.prompts", str(exc))
    return ProbeConfig(
        every_seconds=every,
        on_change=on_change,
        prompts=prompts,
        max_tokens=c.number(d.get("max_tokens"), f"{path}.max_tokens", base.max_tokens, lo=1, hi=4096, integer=True),
        concurrency=c.number(d.get("concurrency"), f"{path}.concurrency", base.concurrency, lo=1, hi=16, integer=True),
        timeout_seconds=c.duration(d.get("timeout"), f"{path}.timeout", base.timeout_seconds),
        api=c.string(d.get("api"), f"{path}.api", base.api, PROBE_APIS),
        model=c.string(d.get("model"), f"{path}.model", base.model) or base.model,
    )


_ROUTE_KEYS = {
    "name",
    "engine",
    "url",
    "match",
    "engines",
    "gpus",
    "version_url",
    "detection",
    "drop",
    "baseline",
    "crossover",
    "probe",
} | _HTTP_CLIENT_KEYS


def _route(c: _Checker, raw: Any, path: str, detection: DetectionConfig, http: HttpClientConfig) -> RouteConfig | None:
    d = c.mapping(raw, path, _ROUTE_KEYS, {"name", "url"})
    if d is None:
        return None
    name = c.string(d.get("name"), f"{path}.name")
    if name and not _ROUTE_NAME_RE.match(name):
        c.fail(f"{path}.name", f"only letters, digits and _.:- are allowed, got {name!r}")
    if d.get("engine") == "sglang_request_log":  # SGLang's per-request files: url is file:///<directory>
        url = _file_url(c, d.get("url"), f"{path}.url") if "url" in d else ""
    else:
        url = _http_url(c, d.get("url"), f"{path}.url") if "url" in d else ""
    version_url = _http_url(c, d["version_url"], f"{path}.version_url") if d.get("version_url") else ""
    engines_raw = d.get("engines") or []
    engines: list[str] = []
    if not isinstance(engines_raw, list):
        c.fail(f"{path}.engines", "must be a list of engine indexes")
    else:
        for i, e in enumerate(engines_raw):
            if isinstance(e, bool) or not isinstance(e, (str, int)):
                c.fail(f"{path}.engines[{i}]", f"must be an engine index, got {e!r}")
            else:
                engines.append(str(e))
    gpus: tuple[int, ...] | None = None
    if "gpus" in d:
        g = d["gpus"]
        if not isinstance(g, list):
            c.fail(f"{path}.gpus", "must be a list of GPU indexes")
        else:
            vals = [c.number(x, f"{path}.gpus[{i}]", None, lo=0, integer=True) for i, x in enumerate(g)]
            gpus = tuple(v for v in vals if v is not None)
    det = _detection(c, d.get("detection"), f"{path}.detection", detection)
    if "drop" in d:  # shorthand for detection.drop
        det = DetectionConfig(
            **{**det.__dict__, "drop": c.number(d["drop"], f"{path}.drop", det.drop, lo=0.0, hi=0.95, lo_open=True)}
        )
    return RouteConfig(
        name=name,
        url=url,
        engine=c.string(d.get("engine"), f"{path}.engine", RouteConfig.engine, ENGINE_KINDS),
        http=_http_client(c, d, path, http),
        match=c.string_map(d.get("match"), f"{path}.match"),
        engines=tuple(engines),
        gpus=gpus,
        version_url=version_url,
        detection=det,
        baseline=_baseline(c, d.get("baseline"), f"{path}.baseline"),
        crossover=_crossover(c, d.get("crossover"), f"{path}.crossover"),
        probe=_probe(c, d.get("probe"), f"{path}.probe"),
    )


_TOP_KEYS = {"interval", "state_dir", "scrape", "routes", "gpu", "otlp", "detection"}


def parse_config(raw: Any, source: str = "") -> Config:
    """Validate an already-loaded YAML document. Raises ConfigError listing every problem."""
    c = _Checker()
    d = c.mapping(raw, "", _TOP_KEYS)
    if d is None:
        raise ConfigError(c.problems, source)
    interval = c.duration(d.get("interval"), "interval", Config.interval_seconds)
    state_dir = c.string(d.get("state_dir"), "state_dir", Config.state_dir)
    scrape = c.mapping(d.get("scrape"), "scrape", {"timeout", "max_body_bytes", "max_series"} | _HTTP_CLIENT_KEYS) or {}
    timeout = c.duration(scrape.get("timeout"), "scrape.timeout", Config.scrape_timeout_seconds)
    if timeout >= interval and "timeout" in scrape:
        c.fail("scrape.timeout", f"must be shorter than interval ({interval:g}s)")
    max_body = c.number(
        scrape.get("max_body_bytes"), "scrape.max_body_bytes", Config.max_body_bytes, lo=1024, integer=True
    )
    max_series = c.number(scrape.get("max_series"), "scrape.max_series", Config.max_series, lo=1, integer=True)
    http = _http_client(c, scrape, "scrape", DEFAULT_HTTP_CLIENT)
    gpu_raw = c.mapping(d.get("gpu"), "gpu", {"enabled"}) or {}
    gpu = GpuConfig(enabled=c.string(gpu_raw.get("enabled"), "gpu.enabled", GpuConfig.enabled, GPU_MODES))
    detection = _detection(c, d.get("detection"), "detection", DetectionConfig())

    otlp = None
    if d.get("otlp") is not None:
        o = c.mapping(d["otlp"], "otlp", {"endpoint", "protocol", "interval", "headers"}, {"endpoint"})
        if o is not None:
            ep = _http_url(c, o.get("endpoint"), "otlp.endpoint") if "endpoint" in o else ""
            otlp = OtlpConfig(
                endpoint=ep,
                protocol=c.string(o.get("protocol"), "otlp.protocol", OtlpConfig.protocol, OTLP_PROTOCOLS),
                interval_seconds=c.duration(o.get("interval"), "otlp.interval", OtlpConfig.interval_seconds),
                headers=c.string_map(o.get("headers"), "otlp.headers"),
            )
            if otlp.protocol == "grpc" and not _module_available(OTLP_GRPC_MODULE):
                c.fail(
                    "otlp.protocol",
                    "grpc needs the opentelemetry-exporter-otlp-proto-grpc package, which is not "
                    "installed; install it or use protocol: http/protobuf",
                )

    routes: list[RouteConfig] = []
    raw_routes = d.get("routes")
    if raw_routes is None:
        raw_routes = []
    if not isinstance(raw_routes, list):
        c.fail("routes", "must be a list")
        raw_routes = []
    seen: dict[str, int] = {}
    probed: dict[str, int] = {}  # engine (scheme://host:port) -> the route that probes it
    for i, r in enumerate(raw_routes):
        route = _route(c, r, f"routes[{i}]", detection, http)
        if route is None:
            continue
        if route.name in seen:
            c.fail(f"routes[{i}].name", f"duplicate route name {route.name!r} (first at routes[{seen[route.name]}])")
        elif route.name:
            seen[route.name] = i
        if route.probe is not None and route.url:
            engine = urlparse(route.url)._replace(path="", params="", query="", fragment="").geturl()
            if engine in probed:
                c.fail(
                    f"routes[{i}].probe",
                    f"routes[{probed[engine]}] already probes {engine}: one route per "
                    "engine may probe it (rounds on one engine must not overlap)",
                )
            else:
                probed[engine] = i
        routes.append(route)
    if c.problems:
        raise ConfigError(c.problems, source)
    return Config(
        interval_seconds=interval,
        state_dir=state_dir,
        scrape_timeout_seconds=timeout,
        max_body_bytes=max_body,
        max_series=max_series,
        routes=tuple(routes),
        gpu=gpu,
        otlp=otlp,
        detection=detection,
    )


def read_yaml_file(path: str) -> Any:
    """A YAML document from a file; unreadable or invalid files raise ConfigError, never a bare OS/YAML error."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read file: {exc}"], path) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"], path) from exc


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file. Raises ConfigError listing every problem."""
    path = str(path)
    return parse_config(read_yaml_file(path), path)


def unreadable_files(cfg: Config) -> list[str]:
    """Secret and certificate files the routes name that cannot be read now, as `route: key: problem`.

    Not config errors: they are read at scrape time (a rotated token or certificate is picked up without a
    reload), so a missing one fails that route's scrapes, not the config. `check-config` warns about them."""
    problems = []
    for r in cfg.routes:
        http = r.http
        files = {
            "tls_config.ca_file": http.tls_config.ca_file,
            "tls_config.cert_file": http.tls_config.cert_file,
            "tls_config.key_file": http.tls_config.key_file,
            "authorization.credentials_file": http.authorization.credentials_file if http.authorization else "",
            "basic_auth.password_file": http.basic_auth.password_file if http.basic_auth else "",
        }
        for key, name in files.items():
            if name:
                try:
                    with open(name, "rb"):
                        pass
                except OSError as exc:
                    problems.append(f"{r.name}: {key}: cannot read {name}: {exc.strerror}")
    return problems


def summarize(cfg: Config) -> str:
    """A short human summary, printed by `check-config` on success."""
    lines = [
        f"interval {cfg.interval_seconds:g}s, state_dir {cfg.state_dir}, gpu {cfg.gpu.enabled}, "
        f"{len(cfg.routes)} route(s)" + (f", otlp -> {cfg.otlp.endpoint}" if cfg.otlp else "")
    ]
    for r in cfg.routes:
        extra = []
        if r.match:
            extra.append("match " + ",".join(f"{k}={v}" for k, v in sorted(r.match.items())))
        if r.engines:
            extra.append("engines " + ",".join(r.engines))
        if r.crossover:
            extra.append(f"crossover {r.crossover.kind}")
        if r.baseline:
            extra.append(f"pinned baseline {r.baseline.acceptance_ratio:g}")
        if r.http.authorization:
            extra.append(f"authorization {r.http.authorization.type}")
        if r.http.basic_auth:
            extra.append(f"basic_auth {r.http.basic_auth.username}")
        if r.http.tls_config.cert_file:
            extra.append("client certificate")
        if r.http.tls_config.insecure_skip_verify:
            extra.append("certificate NOT verified")
        if r.probe:
            extra.append(f"probe every {r.probe.every_seconds:g}s ({r.probe.prompts})")
        details = f" ({'; '.join(extra)})" if extra else ""
        lines.append(f"  {r.name}: {r.engine} {r.url} drop {r.detection.drop:g}{details}")
    return "\n".join(lines)
