"""Every configuration option, defined once: its field, default, YAML key, accepted values and meaning.

A field's metadata names its YAML key and how a value is read (`Duration`, `Number`, `Text`, ...);
`specwatch.config` derives the strict reader from these definitions, and the mixin reads its defaults from
here. A leaf module (standard library only), so the mixin generates offline without importing the daemon.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Iterator, Mapping

DEFAULT_STATE_DIR = "/var/lib/specwatch"
# Durations beyond this are refused wherever no tighter bound applies: far past any sensible period, and far
# inside what datetime arithmetic and float seconds handle.
MAX_DURATION_SECONDS = 365 * 86400.0
# Whole numbers and ratios beyond this are refused before any arithmetic (a 400-digit integer overflows floats).
MAX_NUMBER = 1e15
# A route name is a label value on every per-route series and in log lines: long enough for any naming scheme.
MAX_ROUTE_NAME_CHARS = 128

_DURATION_RE = re.compile(r"^\s*(\d{1,15}(?:\.\d{1,15})?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float | None:
    """'5s' -> 5.0, '10m' -> 600.0, 2 -> 2.0 (bare numbers are seconds); None when unparseable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= MAX_NUMBER else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    m = _DURATION_RE.match(value)
    if not m:
        return None
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


# --------------------------------------------------------------------------- how a value is read
@dataclass(frozen=True)
class Duration:
    """'5s', '10m', '1h', or a bare number of seconds; > `lo` (>= `lo` when `inclusive`) and <= `hi`."""

    lo: float = 0.0
    hi: float = MAX_DURATION_SECONDS
    inclusive: bool = False


@dataclass(frozen=True)
class Number:
    lo: float | None = None
    hi: float | None = None
    integer: bool = False
    lo_open: bool = False


@dataclass(frozen=True)
class Text:
    choices: tuple[str, ...] | None = None
    pattern: str = ""  # a regular expression the whole value must match ...
    pattern_doc: str = ""  # ... and what the error says when it does not
    secret: bool = False  # never quoted in an error
    max_length: int = 0  # characters at most (0: no cap)


@dataclass(frozen=True)
class Flag:
    """true or false."""


@dataclass(frozen=True)
class StringMap:
    """A mapping of names to strings (numbers are taken as their text)."""


@dataclass(frozen=True)
class Section:
    """A nested mapping read into the dataclass `of`. `optional`: None unless the key is given. `flat`: its
    keys sit directly in the enclosing mapping (the field's YAML key is empty)."""

    of: type
    optional: bool = False
    flat: bool = False
    inherit: bool = False  # keys not given keep the enclosing default's values (a route's detection)


@dataclass(frozen=True)
class Custom:
    """Read by a dedicated reader in specwatch.config (lists, URLs, combined keys)."""


Spec = Duration | Number | Text | Flag | StringMap | Section | Custom


def option(yaml: str, spec: Spec, doc: str, default: Any = MISSING, *, factory: Any = MISSING, **kw: Any) -> Any:
    """A dataclass field with its YAML key, reader and meaning; no default means the key is required."""
    metadata = {"yaml": yaml, "spec": spec, "doc": doc}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


@dataclass(frozen=True)
class Option:
    name: str  # the dataclass field
    yaml: str
    spec: Spec
    doc: str
    default: Any  # MISSING when required

    @property
    def required(self) -> bool:
        return self.default is MISSING


def options(cls: type) -> Iterator[Option]:
    """The YAML options of a config dataclass, in definition order (fields without a YAML key are derived)."""
    for f in fields(cls):
        if "yaml" not in f.metadata:
            continue
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        yield Option(f.name, f.metadata["yaml"], f.metadata["spec"], f.metadata["doc"], default)


# --------------------------------------------------------------------------- the options
RATIO = Number(lo=0.0, hi=1.0)
COUNT = Number(lo=0, hi=MAX_NUMBER, integer=True)


@dataclass(frozen=True)
class Authorization:
    """An `Authorization: <type> <credentials>` header; the credentials inline or read from a file per
    request (so a rotated token is picked up without a reload)."""

    type: str = option("type", Text(), "the scheme, one word", "Bearer")
    credentials: str = option("credentials", Text(secret=True), "the credentials inline", "", repr=False)
    credentials_file: str = option("credentials_file", Text(), "a file holding the credentials", "")


@dataclass(frozen=True)
class BasicAuth:
    username: str = option("username", Text(), "the user name (no ':')")
    password: str = option("password", Text(secret=True), "the password inline", "", repr=False)
    password_file: str = option("password_file", Text(), "read per request, like credentials_file", "")


@dataclass(frozen=True)
class TlsConfig:
    ca_file: str = option("ca_file", Text(), "the CA to trust; empty: the system's CAs", "")
    cert_file: str = option("cert_file", Text(), "client certificate, with key_file", "")
    key_file: str = option("key_file", Text(), "the client certificate's key", "")
    server_name: str = option("server_name", Text(), "for SNI and certificate checks; empty: the URL's host", "")
    insecure_skip_verify: bool = option("insecure_skip_verify", Flag(), "do not verify the certificate", False)


@dataclass(frozen=True)
class HttpClientConfig:
    """How engine endpoints are reached, as Prometheus's `http_config` (the subset a scrape uses). Its keys
    sit directly in `scrape:` and in each route, a route's key replacing the `scrape:` one whole."""

    authorization: Authorization | None = option(
        "authorization", Section(Authorization, optional=True), "an Authorization header on every request", None
    )
    basic_auth: BasicAuth | None = option(
        "basic_auth", Section(BasicAuth, optional=True), "HTTP basic auth; not with authorization", None
    )
    tls_config: TlsConfig = option(
        "tls_config", Section(TlsConfig), "CA, client certificate, server name", factory=TlsConfig
    )
    headers: tuple[tuple[str, str], ...] = option(
        "headers", Custom(), "(name, value) pairs sent with every engine request, in the order given", ()
    )


DEFAULT_HTTP_CLIENT = HttpClientConfig()


@dataclass(frozen=True)
class SeedFrom:
    """Where a route with no baseline for its (model, engine version, k, drafter) takes one from: the fleet's median in
    Prometheus of the nodes that have one (evaluators/fleet_seed.py), instead of its own traffic."""

    prometheus: str = option("prometheus", Custom(), "the Prometheus base URL, e.g. http://prometheus:9090")
    query_selector: str = option(
        "query_selector", Text(), 'extra label matchers for the fleet\'s series, e.g. job="specwatch"', ""
    )
    min_nodes: int = option("min_nodes", Number(lo=1, hi=MAX_NUMBER, integer=True), "fewer answers: learn", 3)
    timeout_seconds: float = option(
        "timeout", Duration(hi=60.0), "the whole exchange with Prometheus: connecting and every byte", 5.0
    )
    # One sample per node of the key, about 100-300 bytes each with a fleet's target labels: 4 MiB holds over
    # ten thousand nodes, and bounds what a runaway answer costs (the JSON parsed from it is several times that).
    max_body_bytes: int = option(
        "max_body_bytes", Number(lo=1024, hi=MAX_NUMBER, integer=True), "a larger answer is refused", 4 * 1024 * 1024
    )
    http: HttpClientConfig = option(
        "", Section(HttpClientConfig, flat=True), "basic_auth, authorization, tls_config, headers", DEFAULT_HTTP_CLIENT
    )


@dataclass(frozen=True)
class DetectionConfig:
    drop: float = option(
        "drop", Number(lo=0.0, hi=0.95, lo_open=True), "page when acceptance <= (1 - drop) x baseline", 0.15
    )
    warmup_drafted_tokens: int = option(
        "warmup_drafted_tokens", COUNT, "a baseline is learned from at least this many drafted tokens", 20_000
    )
    warmup_seconds: float = option("warmup_duration", Duration(inclusive=True), "... and at least this long", 1800.0)
    min_drafted_tokens: int = option("min_drafted_tokens", COUNT, "never page on less evidence than this", 2_000)
    min_duration_seconds: float = option(
        "min_duration", Duration(inclusive=True), "the CUSUM excursion must have lasted this long", 180.0
    )
    cusum_threshold: float = option(
        "cusum_threshold",
        Number(lo=0.0, hi=MAX_NUMBER, lo_open=True),
        "CUSUM alarm threshold h, in phi-scaled nats (docs/detection.md: how to tune)",
        10.0,
    )
    adopt_after_seconds: float = option(
        "adopt_after", Duration(inclusive=True), "clean period before a bumped model's own baseline is adopted", 3600.0
    )
    confirm_window_seconds: float = option(
        "confirm_window", Duration(), "short window that confirms a drop is ongoing and resolves it", 300.0
    )
    # Evidence is weighed in blocks this long (or up to an idle scrape): long against one request, so a request
    # split over two scrapes does not hide its own correlation. A busy route of short requests can use less,
    # for a faster verdict; the design effect of a block of many whole requests does not depend on its length.
    block_seconds: float = option("block", Duration(), "evidence is weighed per block of this length", 60.0)
    pin_drafted_tokens: int = option(
        "pin_drafted_tokens", COUNT, "a learned baseline keeps refining until this many tokens ...", 1_000_000
    )
    pin_seconds: float = option(
        "pin_duration", Duration(inclusive=True), "... or this long, then it is pinned", 86400.0
    )
    seed_from: SeedFrom | None = option(
        "seed_from", Section(SeedFrom, optional=True), "a new key's baseline from the fleet's; None: learned", None
    )
    # A route whose traffic detector would take longer than this to page a 20% drop, with no canary probe that
    # pages sooner, is under-watched (alert SpecwatchRouteUnderWatched, `specwatch check-config` advice).
    horizon_budget_seconds: float = option(
        "horizon_budget", Duration(), "longest acceptable expected time to page a 20% drop", 3600.0
    )


@dataclass(frozen=True)
class PinnedBaseline:
    acceptance_ratio: float = option(
        "acceptance_ratio", Number(lo=0.0, hi=1.0, lo_open=True), "the pinned acceptance ratio"
    )
    position_acceptance: tuple[float, ...] = option(
        "position_acceptance", Custom(), "acceptance per draft position, each 0..1", ()
    )
    overdispersion: float | None = option(
        "overdispersion",
        Number(lo=1.0, hi=MAX_NUMBER),
        "variance inflation of per-window counts; None: estimated from the warm-up traffic",
        None,
    )
    # The (model, engine version, k, drafter) the baseline was measured on: it applies only where each given one matches
    # the route's current one, so that one decision rolled out by config management cannot judge another model.
    model: str = option("model", Text(), "the served model name it applies to; empty: any", "")
    engine_version: str = option("engine_version", Text(), "the engine version it applies to; empty: any", "")
    draft_length: int | None = option(
        "draft_length", Number(lo=1, hi=MAX_NUMBER, integer=True), "the draft length k it applies to; None: any", None
    )

    drafter: str = option(
        "drafter", Text(), 'the drafter it applies to, as the baseline key says it ("method:drafter"); empty: any', ""
    )

    def applies_to(self, model: str, engine_version: str, k: int, drafter: str = "") -> bool:
        """Whether this baseline judges traffic of (model, engine version, k, drafter)."""
        return (
            (not self.model or self.model == model)
            and (not self.engine_version or self.engine_version == engine_version)
            and (self.draft_length is None or self.draft_length == k)
            and (not self.drafter or self.drafter == drafter)
        )


# The verify attention kernel an estimate assumes (specwatch/crossover/kernel.py SETTINGS).
ATTENTION_KERNELS = ("auto", "packed", "unpacked")
DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
POSITIVE = Number(lo=0.0, hi=MAX_NUMBER, lo_open=True)
SIZE = Number(lo=1, hi=MAX_NUMBER, integer=True)


@dataclass(frozen=True)
class CrossoverEstimateConfig:
    gpu: str = option("gpu", Text(), "GPU name; empty: detected through NVML", "")
    params: float | None = option("params", POSITIVE, "billions of target parameters", None)
    dtype: str = option("dtype", Text(choices=DTYPES), "weight data type", "bf16")
    layers: int | None = option("layers", SIZE, "transformer layers", None)
    hidden_size: int | None = option("hidden_size", SIZE, "hidden size", None)
    kv_heads: int | None = option("kv_heads", SIZE, "KV heads", None)
    head_dim: int | None = option("head_dim", SIZE, "head dimension", None)
    hf_config: str = option("hf_config", Text(), "a model's config.json instead of the numbers above", "")
    context: float | None = option(
        "context", Number(lo=0.0, hi=MAX_NUMBER), "mean tokens in context; None: derived live from KV usage", None
    )
    draft: str = option(
        "draft",
        Text(
            pattern=r"eagle|eagle3|mtp|ngram|model:\d+(\.\d+)?",
            pattern_doc="must be eagle, eagle3, mtp, ngram or model:<billions>",
        ),
        "the drafter",
        "eagle",
    )


@dataclass(frozen=True)
class CrossoverConfig:
    kind: str  # "sweep" | "estimate" | "batch_size": which of the three keys was given
    sweep_file: str = option("sweep", Text(), "a sweep measured by `specwatch sweep`", "")
    estimate: CrossoverEstimateConfig | None = option(
        "estimate", Section(CrossoverEstimateConfig, optional=True), "a roofline estimate of the crossover", None
    )
    batch_size: float | None = option("batch_size", POSITIVE, "a known crossover batch size", None)
    attention_kernel: str = option(
        "attention_kernel",
        Text(choices=ATTENTION_KERNELS),
        "the engine's verify attention: packed (KV read once per KV head), unpacked (once per query head); "
        "auto: packed for vLLM and SGLang on Hopper, else unknown (the estimate's band covers both)",
        "auto",
    )
    hold_seconds: float = option(
        "hold", Duration(inclusive=True), "the above-crossover flag keeps each state at least this long", 600.0
    )


PROBE_APIS = ("auto", "openai", "sglang")
PROBE_MIN_EVERY_SECONDS = 10.0  # a round sends every prompt


@dataclass(frozen=True)
class ProbeConfig:
    """Canary probes of one route (specwatch/probe/): a fixed greedy prompt set sent every `every_seconds`."""

    every_seconds: float = option(
        "every", Duration(lo=PROBE_MIN_EVERY_SECONDS, inclusive=True), "a round this often", 900.0
    )
    on_change: bool = option(
        "on_change", Flag(), "a round at once when the engine restarts or its model, version or k changes", True
    )
    prompts: str = option("prompts", Text(), '"builtin" or a prompt file (JSON or YAML)', "builtin")
    max_tokens: int = option("max_tokens", Number(lo=1, hi=4096, integer=True), "tokens per prompt", 128)
    concurrency: int = option("concurrency", Number(lo=1, hi=16, integer=True), "requests in flight", 1)
    timeout_seconds: float = option("timeout", Duration(), "per request", 60.0)
    api: str = option("api", Text(choices=PROBE_APIS), "auto: vLLM -> openai, SGLang -> its native /generate", "auto")
    model: str = option("model", Text(), "auto: the first model of /v1/models or the route's model name", "auto")


@dataclass(frozen=True)
class ScrapeConfig:
    """How every engine's /metrics is fetched and bounded (its HTTP client keys are read into each route)."""

    timeout_seconds: float = option(
        "timeout", Duration(), "per engine /metrics request, the whole response; shorter than interval", 2.0
    )
    # A full vLLM exposition is ~85 KB, a few thousand series (below) well under 1 MiB. Every body byte is
    # allocated more than once (read, joined, decoded), and glibc keeps what large freed blocks leave in each
    # thread's arena: the cap bounds that per scrape (bench/hostile_soak.py, docs/benchmarks.md).
    max_body_bytes: int = option(
        "max_body_bytes", Number(lo=1024, hi=MAX_NUMBER, integer=True), "a larger body is refused", 4 * 1024 * 1024
    )
    # A vLLM DP=8 engine serving dozens of LoRA adapters exposes a few thousand series; 100k leaves a wide
    # margin while a 200k-series endpoint (seconds of parsing per cycle) is refused.
    max_series: int = option(
        "max_series",
        Number(lo=1, hi=MAX_NUMBER, integer=True),
        "an endpoint exposing more series is refused (reason too_many_series)",
        100_000,
    )
    http: HttpClientConfig = option(
        "", Section(HttpClientConfig, flat=True), "the defaults of every route's HTTP client", DEFAULT_HTTP_CLIENT
    )


@dataclass(frozen=True)
class SpeculativeConfig:
    """What the route drafts with, for engines that do not say (vLLM): part of the route's baseline key, so a
    change is a model change. Where the engine tells one of them (llama.cpp's method, TensorRT-LLM's both), the
    engine's value is used and the configured one only fills what it leaves out."""

    method: str = option("method", Text(max_length=200), "the speculative method, e.g. eagle3, mtp, ngram", "")
    drafter: str = option("drafter", Text(max_length=500), "the draft model's name or path", "")


@dataclass(frozen=True)
class RouteConfig:
    name: str = option(
        "name",
        Text(
            pattern=r"[A-Za-z0-9_.:-]+",
            pattern_doc="only letters, digits and _.:- are allowed",
            max_length=MAX_ROUTE_NAME_CHARS,
        ),
        "the route label",
    )
    url: str = option("url", Custom(), "the engine's /metrics URL")
    engine: str = option("engine", Custom(), "the engine kind; auto: detected from the metric names", "auto")
    http: HttpClientConfig = option(
        "", Section(HttpClientConfig, flat=True), "each key replaces the scrape: one whole", DEFAULT_HTTP_CLIENT
    )
    match: Mapping[str, str] = option("match", StringMap(), "only series with these labels", factory=dict)
    engines: tuple[str, ...] = option("engines", Custom(), "only these DP engines; empty: all", ())
    worker_label: str = option(
        "worker_label",
        Text(pattern=r"[a-zA-Z_][a-zA-Z0-9_]*", pattern_doc="a label name"),
        "the label naming each worker in a gateway's merged /metrics",
        "worker_addr",
    )
    gpus: tuple[int, ...] | None = option("gpus", Custom(), "GPU indexes; None: found from the processes", None)
    version_url: str = option("version_url", Custom(), "empty: derived from url", "")
    detection: DetectionConfig = option(
        "detection",
        Section(DetectionConfig, inherit=True),
        "overrides of the top-level detection",
        factory=DetectionConfig,
    )
    baseline: PinnedBaseline | None = option(
        "baseline", Section(PinnedBaseline, optional=True), "a pinned baseline", None
    )
    crossover: CrossoverConfig | None = option(
        "crossover", Section(CrossoverConfig, optional=True), "one of sweep, estimate, batch_size", None
    )
    probe: ProbeConfig | None = option("probe", Section(ProbeConfig, optional=True), "canary probes; None: off", None)
    speculative: SpeculativeConfig | None = option(
        "speculative",
        Section(SpeculativeConfig, optional=True),
        "the speculative method and drafter, where the engine does not tell them",
        None,
    )


GPU_MODES = ("auto", "true", "false")


@dataclass(frozen=True)
class GpuConfig:
    enabled: str = option("enabled", Text(choices=GPU_MODES), "auto | true | false", "auto")


OTLP_PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str = option("endpoint", Custom(), "the collector's URL")
    protocol: str = option("protocol", Text(choices=OTLP_PROTOCOLS), "http/protobuf | grpc", "http/protobuf")
    interval_seconds: float = option("interval", Duration(), "push period", 60.0)
    headers: Mapping[str, str] = option("headers", StringMap(), "sent with every push", factory=dict)


# The evaluation loop runs at least every hour (longer makes windows meaningless) and at most every 100 ms.
INTERVAL = Duration(lo=0.1, hi=3600.0, inclusive=True)


@dataclass(frozen=True)
class Config:
    interval_seconds: float = option("interval", INTERVAL, "sampling and evaluation period", 5.0)
    state_dir: str = option("state_dir", Text(), "where learned baselines are kept", DEFAULT_STATE_DIR)
    scrape: ScrapeConfig = option("scrape", Section(ScrapeConfig), "how engines are scraped", factory=ScrapeConfig)
    routes: tuple[RouteConfig, ...] = option("routes", Custom(), "one route per engine endpoint", ())
    gpu: GpuConfig = option("gpu", Section(GpuConfig), "NVML", factory=GpuConfig)
    otlp: OtlpConfig | None = option("otlp", Section(OtlpConfig, optional=True), "OTLP push; None: off", None)
    detection: DetectionConfig = option(
        "detection", Section(DetectionConfig), "acceptance-drop detection defaults", factory=DetectionConfig
    )

    def route(self, name: str) -> RouteConfig | None:
        return next((r for r in self.routes if r.name == name), None)


def default_of(cls: type, name: str) -> Any:
    """The default of one field, for readers outside the config (the mixin's texts)."""
    return next(o.default for o in options(cls) if o.name == name)
