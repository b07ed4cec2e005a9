"""Strict YAML configuration: frozen dataclasses, unknown keys are errors, every problem reported at once.

`load_config(path)` returns a `Config` or raises `ConfigError` whose `.problems` lists each problem with its
path (`routes[1].url: not an http(s) URL`). Nothing half-valid is ever returned, so a reload either swaps
the whole config or keeps the old one. The options themselves (fields, defaults, YAML keys, accepted values)
are defined once, in `specwatch.config_schema`; the reader here is derived from them, with checks that span
several keys beside it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import reprlib
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import yaml

from specwatch import secret_files
from specwatch.config_schema import (
    DEFAULT_HTTP_CLIENT,
    DEFAULT_STATE_DIR,
    GPU_MODES,
    MAX_NUMBER,
    OTLP_PROTOCOLS,
    PROBE_APIS,
    Authorization,
    BasicAuth,
    Config,
    CrossoverConfig,
    CrossoverEstimateConfig,
    Custom,
    DetectionConfig,
    Duration,
    Flag,
    GpuConfig,
    HttpClientConfig,
    Number,
    OtlpConfig,
    PinnedBaseline,
    SeedFrom,
    ProbeConfig,
    RouteConfig,
    ScrapeConfig,
    Section,
    Spec,
    SpeculativeConfig,
    StringMap,
    Text,
    TlsConfig,
    options,
    parse_duration,
)
from specwatch.probe.prompts import PromptSetError, load_prompt_set  # a leaf module: json and PyYAML only
from specwatch.engine_kinds import ENGINE_KINDS  # a leaf module: the names engines.py keys its registry by

DEFAULT_CONFIG_PATH = "/etc/specwatch/specwatch.yml"
OTLP_GRPC_MODULE = "opentelemetry.exporter.otlp.proto.grpc"  # optional dependency, only for protocol: grpc

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_HTTP_CLIENT",
    "DEFAULT_STATE_DIR",
    "ENGINE_KINDS",
    "GPU_MODES",
    "OTLP_PROTOCOLS",
    "PROBE_APIS",
    "Authorization",
    "BasicAuth",
    "Config",
    "ConfigError",
    "CrossoverConfig",
    "CrossoverEstimateConfig",
    "DetectionConfig",
    "GpuConfig",
    "HttpClientConfig",
    "OtlpConfig",
    "PinnedBaseline",
    "SeedFrom",
    "ProbeConfig",
    "RouteConfig",
    "ScrapeConfig",
    "SpeculativeConfig",
    "TlsConfig",
    "load_config",
    "parse_config",
    "parse_duration",
    "read_yaml_file",
    "summarize",
    "unreadable_files",
]


# Bounds on what is parsed at all: a config is a few kilobytes, a few levels deep, with a handful of anchors.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ALIASES = 100
MAX_NODES = 100_000  # counted with every alias expanded, as the reader would walk them
MAX_NUMBER_CHARS = 32  # a longer integer or float literal is refused before Python converts it
MAX_PROBLEMS = 100
EXCERPT_CHARS = 60

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxstring, _repr.maxother = 2, 4, 4, EXCERPT_CHARS, EXCERPT_CHARS
_repr.maxlong = EXCERPT_CHARS


def _q(value: Any) -> str:
    """A value quoted for an error message: at most EXCERPT_CHARS characters, computed in bounded time."""
    text = _repr.repr(value)
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


class ConfigError(ValueError):
    """A configuration was rejected; `problems` holds every problem found, each prefixed with its path (the
    first MAX_PROBLEMS of them)."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        problems = list(problems)
        if len(problems) > MAX_PROBLEMS:
            problems = problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more problem(s)"]
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + f"{len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


# --------------------------------------------------------------------------- the checker
def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


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
                self.fail(_join(path, key), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for key in sorted(required - set(value)):
            self.fail(_join(path, key), "required")
        return value

    def value(self, spec: Spec, value: Any, path: str, default: Any) -> Any:
        """One option's value read by its spec; `default` when absent or wrong (the problem is recorded)."""
        if isinstance(spec, Duration):
            return self.duration(value, path, default, spec)
        if isinstance(spec, Number):
            return self.number(value, path, default, spec.lo, spec.hi, spec.integer, spec.lo_open)
        if isinstance(spec, Text):
            return self.text(value, path, default, spec)
        if isinstance(spec, Flag):
            if value is None:
                return default
            if not isinstance(value, bool):
                self.fail(path, f"must be true or false, got {_q(value)}")
                return default
            return value
        if isinstance(spec, StringMap):
            return self.string_map(value, path)
        raise TypeError(f"{path}: {_q(spec)} is read by its own reader")

    def duration(self, value: Any, path: str, default: float, spec: Duration) -> float:
        if value is None:
            return default
        seconds = parse_duration(value)
        if seconds is None:
            self.fail(path, f"not a duration like 5s, 10m, 1h: {_q(value)}")
            return default
        if seconds < spec.lo or (seconds == spec.lo and not spec.inclusive):
            self.fail(path, f"must be {'at least' if spec.inclusive else 'more than'} {spec.lo:g}s, got {_q(value)}")
            return default
        if seconds > spec.hi:
            self.fail(path, f"must be at most {spec.hi:g}s, got {_q(value)}")
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
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
            self.fail(path, f"must be a number of at most {MAX_NUMBER:g}, got {_q(value)}")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(path, f"must be a {'whole ' if integer else ''}number, got {_q(value)}")
            return default
        if integer and value != int(value):
            self.fail(path, f"must be a whole number, got {_q(value)}")
            return default
        if lo is not None and (value < lo or (lo_open and value == lo)):
            self.fail(path, f"must be {'>' if lo_open else '>='} {lo:g}, got {_q(value)}")
            return default
        if hi is not None and value > hi:
            self.fail(path, f"must be <= {hi:g}, got {_q(value)}")
            return default
        return int(value) if integer else float(value)

    def text(self, value: Any, path: str, default: str, spec: Text) -> str:
        if value is None:
            return default
        if isinstance(value, bool) and spec.choices and "true" in spec.choices:
            value = "true" if value else "false"
        if not isinstance(value, str):
            self.fail(path, "must be a string" if spec.secret else f"must be a string, got {_q(value)}")
            return default
        if spec.choices is not None and value not in spec.choices:
            self.fail(path, f"must be one of {', '.join(spec.choices)}, got {_q(value)}")
            return default
        if spec.max_length and len(value) > spec.max_length:
            self.fail(path, f"{len(value)} characters, over the cap of {spec.max_length}: {_q(value)}")
            return default
        if spec.pattern and value and not re.fullmatch(spec.pattern, value):
            self.fail(path, f"{spec.pattern_doc}, got {_q(value)}")
            return default
        return value

    def string(self, value: Any, path: str, default: str = "", choices: tuple[str, ...] | None = None) -> str:
        return self.text(value, path, default, Text(choices=choices))

    def string_map(self, value: Any, path: str) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping of strings, got {type(value).__name__}")
            return {}
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, (str, int, float)) or isinstance(v, bool):
                self.fail(f"{path}.{k}", f"must be a string, got {_q(v)}")
            else:
                out[k] = str(v)
        return out


# --------------------------------------------------------------------------- the derived reader
# An option read by its own function: (checker, raw value, path, default) -> value. For a flat section the
# raw value is the enclosing mapping.
Reader = Callable[[_Checker, Any, str, Any], Any]
# Checks spanning several keys of one section, run once it is read: (checker, section, raw mapping, path).
Check = Callable[[_Checker, Any, dict, str], Any]


def _allowed_keys(cls: type) -> set[str]:
    keys: set[str] = set()
    for o in options(cls):
        if isinstance(o.spec, Section) and o.spec.flat:
            keys |= _allowed_keys(o.spec.of)
        else:
            keys.add(o.yaml)
    return keys


def _read(c: _Checker, cls: type, raw: Any, path: str, base: Any = None) -> Any:
    """Read the mapping `raw` into `cls` by its options: unknown keys and missing required ones are problems,
    an absent key keeps the default (or `base`'s value, for a section that inherits). None when `raw` is not
    a mapping or a required key is missing."""
    allowed = _allowed_keys(cls) | _SHORTHANDS.get(cls, set())
    required = {o.yaml for o in options(cls) if o.required}
    d = c.mapping(raw, path, allowed, required)
    if d is None:
        return None
    values: dict[str, Any] = {}
    complete = True
    for o in options(cls):
        default = getattr(base, o.name) if base is not None else o.default
        p = _join(path, o.yaml)
        spec = o.spec
        if isinstance(spec, Section) and spec.flat:
            values[o.name] = _FLAT[spec.of](c, d, path, default)
            continue
        given = d.get(o.yaml)
        if o.required and given is None:
            complete = False
            continue
        if o.yaml not in d:
            values[o.name] = default
        elif isinstance(spec, Custom):
            values[o.name] = _CUSTOM[(cls, o.name)](c, given, p, default)
        elif isinstance(spec, Section):
            if spec.optional and given is None:
                values[o.name] = default
            else:
                section = _read(c, spec.of, given, p, default if spec.inherit else None)
                values[o.name] = default if section is None else section
        else:
            values[o.name] = c.value(spec, given, p, default)
    if not complete:
        return None
    check = _CHECKS.get(cls)
    if check is not None:
        return check(c, values, d, path)
    return cls(**values)


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _http_url(c: _Checker, value: Any, path: str, _default: Any = "") -> str:
    if not isinstance(value, str):
        c.fail(path, f"not an http(s) URL: {_q(value)}")
        return ""
    try:
        parsed = urlparse(value)
        _ = parsed.port  # raises on a port out of range or not a number
    except ValueError as exc:  # a malformed IPv6 host, a bad port
        c.fail(path, f"not a valid URL ({exc}): {_q(value)}")
        return ""
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        c.fail(path, f"not an http(s) URL: {_q(value)}")
    elif "@" in parsed.netloc:  # the message leaves the URL out: it holds a secret
        c.fail(path, "credentials in the URL are not allowed (and would not be sent); use basic_auth or authorization")
        return ""
    return value


def _file_url(c: _Checker, value: Any, path: str) -> str:
    try:
        parsed = urlparse(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path:
        c.fail(path, f"not a file:// URL of a directory (engine sglang_request_log): {_q(value)}")
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


def _headers(c: _Checker, raw: Any, path: str, _default: Any = ()) -> tuple[tuple[str, str], ...]:
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


def _one_secret(c: _Checker, d: dict, path: str, inline: str, from_file: str) -> None:
    if inline in d and from_file in d:
        c.fail(path, f"give {inline} or {from_file}, not both")


def _check_authorization(c: _Checker, v: dict, d: dict, path: str) -> Authorization:
    auth_type = v["type"]
    if auth_type.lower() == "basic":
        c.fail(f"{path}.type", "Basic is set with basic_auth, not authorization")
    elif not _HEADER_NAME_RE.match(auth_type):
        c.fail(f"{path}.type", f"must be one word like Bearer, got {_q(auth_type)}")
    _one_secret(c, d, path, "credentials", "credentials_file")
    if not v["credentials"] and not v["credentials_file"]:
        c.fail(path, "give credentials or credentials_file")
    return Authorization(**v)


def _check_basic_auth(c: _Checker, v: dict, d: dict, path: str) -> BasicAuth:
    if ":" in v["username"]:
        c.fail(f"{path}.username", "must not contain ':'")
    _one_secret(c, d, path, "password", "password_file")
    return BasicAuth(**v)


def _check_tls(c: _Checker, v: dict, d: dict, path: str) -> TlsConfig:
    if ("cert_file" in d) != ("key_file" in d):
        c.fail(path, "cert_file and key_file go together")
    return TlsConfig(**v)


def _http_client(c: _Checker, d: dict, path: str, base: HttpClientConfig) -> HttpClientConfig:
    """The HTTP client keys of `d` (a route, or `scrape`); each key given replaces the same key of `base`."""
    if "authorization" in d and "basic_auth" in d:
        c.fail(path or "basic_auth", "give authorization or basic_auth, not both")
    given = {k: v for k, v in d.items() if k in _allowed_keys(HttpClientConfig)}
    client = _read(c, HttpClientConfig, given, path, base)
    if client is None:
        return base
    if "authorization" in d:  # one kind of credentials replaces the other
        client = HttpClientConfig(client.authorization, None, client.tls_config, client.headers)
    elif "basic_auth" in d:
        client = HttpClientConfig(None, client.basic_auth, client.tls_config, client.headers)
    return client


def _position_acceptance(c: _Checker, raw: Any, path: str, default: Any) -> tuple[float, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.fail(path, "must be a list of ratios")
        return ()
    values = [c.number(p, f"{path}[{i}]", None, lo=0.0, hi=1.0) for i, p in enumerate(raw)]
    return tuple(v for v in values if v is not None)


def _engines(c: _Checker, raw: Any, path: str, default: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.fail(path, "must be a list of engine indexes")
        return ()
    engines = []
    for i, e in enumerate(raw):
        if isinstance(e, bool) or not isinstance(e, (str, int)):
            c.fail(f"{path}[{i}]", f"must be an engine index, got {_q(e)}")
        else:
            engines.append(str(e))
    return tuple(engines)


def _gpus(c: _Checker, raw: Any, path: str, default: Any) -> tuple[int, ...] | None:
    if not isinstance(raw, list):
        c.fail(path, "must be a list of GPU indexes")
        return None
    values = [c.number(x, f"{path}[{i}]", None, lo=0, hi=MAX_NUMBER, integer=True) for i, x in enumerate(raw)]
    return tuple(v for v in values if v is not None)


def _engine(c: _Checker, raw: Any, path: str, default: str) -> str:
    return c.string(raw, path, default, ENGINE_KINDS)


def _version_url(c: _Checker, raw: Any, path: str, default: str) -> str:
    return _http_url(c, raw, path) if raw else ""


def _check_crossover(c: _Checker, v: dict, d: dict, path: str) -> CrossoverConfig | None:
    present = [k for k in ("sweep", "estimate", "batch_size") if k in d]
    if len(present) != 1:
        c.fail(path, "give exactly one of sweep, estimate, batch_size")
        return None
    if present == ["estimate"] and v["estimate"] is None:
        v["estimate"] = CrossoverEstimateConfig()
    return CrossoverConfig(kind=present[0], **v)


def _check_probe(c: _Checker, v: dict, d: dict, path: str) -> ProbeConfig:
    if v["prompts"] and "prompts" in d:
        try:
            load_prompt_set(v["prompts"])
        except PromptSetError as exc:
            c.fail(f"{path}.prompts", str(exc))
    v["model"] = v["model"] or ProbeConfig.model
    return ProbeConfig(**v)


def _check_route(c: _Checker, v: dict, d: dict, path: str) -> RouteConfig:
    if d.get("engine") == "sglang_request_log":  # SGLang's per-request files: url is file:///<directory>
        v["url"] = _file_url(c, d["url"], f"{path}.url")
    else:
        v["url"] = _http_url(c, d["url"], f"{path}.url")
    if "drop" in d:  # shorthand for detection.drop
        det = v["detection"]
        drop = next(o.spec for o in options(DetectionConfig) if o.name == "drop")
        v["detection"] = dataclasses.replace(det, drop=c.value(drop, d["drop"], f"{path}.drop", det.drop))
    return RouteConfig(**v)


def _as_given(c: _Checker, raw: Any, path: str, default: Any) -> Any:
    """Kept as given, for a check that needs the other keys (a route's url and engine)."""
    return raw


_CUSTOM: dict[tuple[type, str], Reader] = {
    (PinnedBaseline, "position_acceptance"): _position_acceptance,
    (HttpClientConfig, "headers"): _headers,
    (RouteConfig, "url"): _as_given,
    (RouteConfig, "engine"): _engine,
    (RouteConfig, "engines"): _engines,
    (RouteConfig, "gpus"): _gpus,
    (RouteConfig, "version_url"): _version_url,
    (OtlpConfig, "endpoint"): _http_url,
    (SeedFrom, "prometheus"): _http_url,
    (Config, "routes"): _as_given,
}
_SHORTHANDS: dict[type, set[str]] = {RouteConfig: {"drop"}}  # read by the section's check
_FLAT: dict[type, Reader] = {HttpClientConfig: _http_client}
_CHECKS: dict[type, Check] = {
    Authorization: _check_authorization,
    BasicAuth: _check_basic_auth,
    TlsConfig: _check_tls,
    CrossoverConfig: _check_crossover,
    ProbeConfig: _check_probe,
    RouteConfig: _check_route,
}


def _check_config(c: _Checker, v: dict, d: dict, path: str) -> Config:
    scrape: ScrapeConfig = v["scrape"]
    if (
        scrape.timeout_seconds >= v["interval_seconds"]
        and isinstance(d.get("scrape"), dict)
        and "timeout" in d["scrape"]
    ):
        c.fail("scrape.timeout", f"must be shorter than interval ({v['interval_seconds']:g}s)")
    otlp: OtlpConfig | None = v["otlp"]
    if otlp is not None and otlp.protocol == "grpc" and not _module_available(OTLP_GRPC_MODULE):
        c.fail(
            "otlp.protocol",
            "grpc needs the opentelemetry-exporter-otlp-proto-grpc package, which is not "
            "installed; install it or use protocol: http/protobuf",
        )
    v["routes"] = _routes(c, v["routes"], RouteConfig(name="", url="", http=scrape.http, detection=v["detection"]))
    return Config(**v)


def _routes(c: _Checker, raw: Any, base: RouteConfig) -> tuple[RouteConfig, ...]:
    if raw is None or raw == ():
        return ()
    if not isinstance(raw, list):
        c.fail("routes", "must be a list")
        return ()
    routes: list[RouteConfig] = []
    seen: dict[str, int] = {}
    probed: dict[str, int] = {}  # engine (scheme://host:port) -> the route that probes it
    for i, r in enumerate(raw):
        route = _read(c, RouteConfig, r, f"routes[{i}]", base)
        if route is None:
            continue
        if route.name in seen:
            c.fail(f"routes[{i}].name", f"duplicate route name {_q(route.name)} (first at routes[{seen[route.name]}])")
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
    return tuple(routes)


_CHECKS[Config] = _check_config


def parse_config(raw: Any, source: str = "") -> Config:
    """Validate an already-loaded YAML document. Raises ConfigError listing every problem."""
    c = _Checker()
    cfg = _read(c, Config, raw, "")
    if c.problems or cfg is None:
        raise ConfigError(c.problems, source)
    return cfg


class _Refused(yaml.YAMLError):
    """A document past one of the parsing bounds."""

    def __init__(self, what: str, mark: Any = None) -> None:
        where = f" (line {mark.line + 1})" if mark is not None else ""
        super().__init__(what + where)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounds: nesting depth and alias uses while composing, then the size of the
    document with every alias expanded, duplicate keys and number lengths, all before any value is built."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(f"more than {MAX_ALIASES} aliases", self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _check_nodes(root: yaml.Node) -> None:
    """Refuse a composed document that expands past MAX_NODES, repeats a key or holds an over-long number."""
    sizes: dict[int, int] = {}
    total = 0

    def size(node: yaml.Node, path: str) -> int:
        nonlocal total
        known = sizes.get(id(node))
        if known is not None:  # an alias: the reader walks it again, so it counts again
            total += known
            if total > MAX_NODES:
                raise _Refused(f"more than {MAX_NODES} values once aliases are expanded", node.start_mark)
            return known
        before = total
        total += 1
        if isinstance(node, yaml.ScalarNode):
            if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
                raise _Refused(
                    f"{path or 'document'}: a number longer than {MAX_NUMBER_CHARS} characters", node.start_mark
                )
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                size(item, f"{path}[{i}]")
        elif isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if name in seen:
                        raise _Refused(f"{_join(path, name)}: duplicate key {_q(name)}", key.start_mark)
                    seen.add(name)
                size(key, path)
                size(value, _join(path, name))
        if total > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values once aliases are expanded", node.start_mark)
        sizes[id(node)] = total - before
        return total - before

    size(root, "")


def parse_yaml(text: str) -> Any:
    """One YAML document, within the bounds above. Raises yaml.YAMLError (a `_Refused` past a bound)."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_nodes(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def read_yaml_file(path: str) -> Any:
    """A YAML document from a file; unreadable, oversized or invalid files raise ConfigError, never a bare
    OS/YAML error."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError([f"larger than {MAX_FILE_BYTES} bytes"], path)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read file: {exc}"], path) from exc
    try:
        return parse_yaml(text)
    except _Refused as exc:
        raise ConfigError([f"refused: {exc}"], path) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {_q_yaml(exc)}"], path) from exc


def _q_yaml(exc: yaml.YAMLError) -> str:
    """PyYAML's message (with its line and column) without the quoted source line, which may be huge."""
    if isinstance(exc, yaml.MarkedYAMLError):
        for mark in (exc.context_mark, exc.problem_mark):
            if mark is not None:
                mark.buffer = None  # no snippet
        return str(exc)
    return str(exc)[:300]


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file. Raises ConfigError listing every problem."""
    path = str(path)
    return parse_config(read_yaml_file(path), path)


def load_http_client_config(path: str) -> HttpClientConfig:
    """A route's HTTP client keys (authorization, basic_auth, tls_config, headers) from a YAML file of their
    own, checked as in the config: for commands that take a URL on the command line (`status`, `sweep`), as
    promtool's `--http.config.file`. Raises ConfigError listing every problem."""
    c = _Checker()
    d = c.mapping(read_yaml_file(path), "", _allowed_keys(HttpClientConfig))
    client = _http_client(c, d or {}, "", DEFAULT_HTTP_CLIENT)
    if c.problems:
        raise ConfigError(c.problems, path)
    return client


def unreadable_files(cfg: Config) -> list[str]:
    """Secret and certificate files the routes and `detection.seed_from` name that cannot be read now, as
    `where: key: problem`.

    Not config errors: they are read at scrape time (a rotated token or certificate is picked up without a
    reload), so a missing one fails that route's scrapes (or the fleet query, and the route learns its own
    baseline), not the config. `check-config` warns about them. A route's `seed_from` is listed under the route
    only where it is its own, not the top-level one it inherits."""
    problems = []
    top = cfg.detection.seed_from
    if top is not None:
        problems += _unreadable(top.http, "detection.seed_from")
    for r in cfg.routes:
        problems += _unreadable(r.http, r.name)
        seed = r.detection.seed_from
        if seed is not None and seed != top:
            problems += _unreadable(seed.http, f"{r.name}: detection.seed_from")
    return problems


def _unreadable(http: HttpClientConfig, where: str) -> list[str]:
    files = {
        "tls_config.ca_file": http.tls_config.ca_file,
        "tls_config.cert_file": http.tls_config.cert_file,
        "tls_config.key_file": http.tls_config.key_file,
        "authorization.credentials_file": http.authorization.credentials_file if http.authorization else "",
        "basic_auth.password_file": http.basic_auth.password_file if http.basic_auth else "",
    }
    problems = []
    for key, name in files.items():
        if name:
            cap = secret_files.MAX_TLS_FILE_BYTES if key.startswith("tls") else secret_files.MAX_SECRET_BYTES
            found = secret_files.problem(name, cap)
            if found:
                problems.append(f"{where}: {key}: {found}")
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
        seed = r.detection.seed_from
        if seed is not None:
            extra.append(
                f"seed_from {seed.prometheus} (min_nodes {seed.min_nodes}, timeout {seed.timeout_seconds:g}s, "
                f"max_body_bytes {seed.max_body_bytes})"
            )
        details = f" ({'; '.join(extra)})" if extra else ""
        lines.append(f"  {r.name}: {r.engine} {r.url} drop {r.detection.drop:g}{details}")
    return "\n".join(lines)
