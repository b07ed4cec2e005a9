"""`--web.config.file`: TLS and basic auth in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: /etc/specwatch/tls.crt     # relative paths are relative to this file, as in exporter-toolkit
      key_file: /etc/specwatch/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional; needs client_ca_file
      client_ca_file: /etc/specwatch/clients-ca.crt
      min_version: TLS12                    # TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2b$12$...                # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')
    admin_users:                            # specwatch's own keys: who may POST to the admin API
      ops: $2b$12$...                       #   (a basic_auth_users user may scrape, never act)
    admin_client_cert_subjects: ["CN=ops-admin,O=example"]   # verified client certificates, RFC 4514
    allowed_hosts: [specwatch.example.com, "10.0.0.7:9448"]  # any other Host header gets 421 (DNS rebinding)
    allowed_origins: [https://ops.example.com]               # cross-origin admin POSTs allowed from these

Admin POSTs need an admin identity whenever users or admin subjects are configured; without either, only
`--web.enable-admin-api` turns them on (commands/run.py).

`load_web_config(path)` parses strictly (unknown keys are errors, every problem reported at once) and checks
that the certificate, key and CA actually load, so a broken file fails at start-up or reload, never at the
first scrape. The certificate, key and CA files pass `secret_files`' checks (a size cap; a FIFO, device or
directory refused before anything opens it) at load and again at every rotation, and a key file others can
read is warned about. The returned `WebConfig` gives the HTTP server an `ssl_context()` and an
`authorize(headers)`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from specwatch import secret_files
from specwatch.config import ConfigError, read_yaml_file

log = logging.getLogger(__name__)

TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit's names. Python's ssl module cannot accept a client certificate without verifying it, so the
# two "request but do not verify" policies are refused with a pointer to their verifying equivalents.
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# Accepted so exporter-toolkit files load unchanged; Python's defaults (modern AEAD suites, X25519/P-256) apply.
_IGNORED_TLS_KEYS = ("cipher_suites", "curve_preferences", "prefer_server_cipher_suites")
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    *_IGNORED_TLS_KEYS,
}
_TOP_KEYS = {
    "tls_server_config",
    "basic_auth_users",
    "http_server_config",
    "admin_users",
    "admin_client_cert_subjects",
    "allowed_hosts",
    "allowed_origins",
}
_HTTP_SERVER_KEYS = {"http2"}  # accepted and ignored: the server speaks HTTP/1.1 only

_BCRYPT_RE = re.compile(r"^\$2[aby]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
AUTH_CACHE_SECONDS = 60.0
AUTH_CACHE_MAX_ENTRIES = 128  # per outcome: successes and failures each
BCRYPT_CONCURRENCY = 2


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    min_version: str = "TLS12"
    max_version: str = ""  # "" = the highest the OpenSSL build supports


def build_ssl_context(tls: TlsServerConfig) -> ssl.SSLContext:
    """A server context for `tls`. Raises OSError/ssl.SSLError when a file is missing or does not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    if tls.max_version:
        ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    ctx.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    if tls.client_ca_file:
        ctx.load_verify_locations(cafile=tls.client_ca_file)
    return ctx


def _warn_exposed_key(tls: TlsServerConfig) -> None:
    """The certificate and CA are public; the key is the one file others must not read."""
    warning = secret_files.exposure(tls.key_file, os.getegid())
    if warning:
        log.warning("web config: TLS key file %s", warning)


class _ReloadingContext:
    """Picks up rotated certificate/key/CA files (cert-manager, ACME) without a restart, as exporter-toolkit
    does: on each handshake the files' stat is compared, and a changed set is loaded into a new context that
    the connection switches to. The stat is `secret_files.checked_stamp`'s, so a file swapped for a FIFO (whose
    open would block the event loop, and every connection with it), a device or an oversized file is refused
    before `ssl` opens it. A rotation that is refused or fails to load is logged once and the old context keeps
    serving.
    """

    def __init__(self, tls: TlsServerConfig) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._stamp, refused = self._files_stamp()
        if refused:
            raise secret_files.SecretFileError(refused)
        self._current = build_ssl_context(tls)
        self.context = build_ssl_context(tls)  # the listening socket's context; only its callback is used
        self.context.sni_callback = self._on_client_hello

    def _files_stamp(self) -> tuple[tuple[Any, ...], str]:
        """The files' stamps (a refusal's text in place of one) and the first refusal, "" for none."""
        stamp: list[Any] = []
        refused = ""
        for path in (self._tls.cert_file, self._tls.key_file, self._tls.client_ca_file):
            try:
                stamp.append(secret_files.checked_stamp(path, secret_files.MAX_TLS_FILE_BYTES) if path else None)
            except secret_files.SecretFileError as exc:
                stamp.append(str(exc))
                refused = refused or str(exc)
        return tuple(stamp), refused

    def _on_client_hello(self, sock: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        with self._lock:
            stamp, refused = self._files_stamp()
            if stamp != self._stamp:
                self._stamp = stamp
                if refused:
                    log.error("web config: rotated TLS files refused, keeping the previous ones: %s", refused)
                else:
                    try:
                        self._current = build_ssl_context(self._tls)
                        log.info("web config: reloaded TLS certificate %s", self._tls.cert_file)
                        _warn_exposed_key(self._tls)
                    except (OSError, ssl.SSLError) as exc:
                        log.error("web config: rotated TLS files do not load, keeping the previous ones: %s", exc)
            sock.context = self._current


class _BasicAuth:
    """bcrypt basic auth that does not reveal which users exist, does not cost a bcrypt per scrape, and never
    makes a right password wait behind wrong ones.

    An unknown user is checked against a dummy hash of the configured cost, so it takes as long as a wrong
    password. Outcomes are remembered under an HMAC of (user, hash, password) with a per-process random key (the
    cache never holds a password, and a changed hash invalidates it): a success for AUTH_CACHE_SECONDS from its
    last use, a failure for as long, in a bounded cache, so a repeated wrong password costs one bcrypt. The
    caches are read before any waiting; at most BCRYPT_CONCURRENCY checks run at a time (a flood of new wrong
    passwords burns that many cores, not all of them).
    """

    def __init__(self, users: Mapping[str, str], clock: Callable[[], float] = time.monotonic) -> None:
        import bcrypt  # deferred: only deployments with basic auth pay for the import

        self._bcrypt = bcrypt
        self._users = {u: h.encode() for u, h in users.items()}
        cost = max(int(m.group(1)) for m in map(_BCRYPT_RE.match, users.values()) if m)  # validated at load
        self._dummy_hash = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(cost))
        self._cache_key = secrets.token_bytes(32)
        self._passed: dict[bytes, float] = {}  # digest -> expiry (monotonic)
        self._failed: dict[bytes, float] = {}
        self._cache_lock = threading.Lock()  # held only for dictionary updates, never across a bcrypt
        self._bcrypt_slots = threading.BoundedSemaphore(BCRYPT_CONCURRENCY)
        self._clock = clock

    def _digest(self, user: str, password: str) -> tuple[bytes, bytes]:
        hashed = self._users.get(user, self._dummy_hash)
        # length-prefixed parts, so no (user, password) pair can collide with another's encoding
        parts = (user.encode(), hashed, password.encode())
        digest = hmac.new(self._cache_key, b"".join(len(p).to_bytes(4, "big") + p for p in parts), hashlib.sha256)
        return digest.digest(), hashed

    def cached(self, user: str, password: str) -> bool | None:
        """The remembered outcome for this pair, or None when only a bcrypt check can tell."""
        return self._lookup(self._digest(user, password)[0])

    def _lookup(self, digest: bytes) -> bool | None:
        now = self._clock()
        with self._cache_lock:
            if self._passed.get(digest, 0.0) > now:
                self._passed[digest] = now + AUTH_CACHE_SECONDS
                return True
            if self._failed.get(digest, 0.0) > now:
                return False
        return None

    def check(self, user: str, password: str) -> bool:
        digest, hashed = self._digest(user, password)
        remembered = self._lookup(digest)
        if remembered is not None:
            return remembered
        with self._bcrypt_slots:
            remembered = self._lookup(digest)  # the same pair may have been checked while this one waited
            if remembered is not None:
                return remembered
            ok = self._bcrypt.checkpw(password.encode(), hashed) and user in self._users
        with self._cache_lock:
            cache = self._passed if ok else self._failed
            now = self._clock()
            if len(cache) >= AUTH_CACHE_MAX_ENTRIES:
                for key in [k for k, t in cache.items() if t <= now]:
                    del cache[key]
                if len(cache) >= AUTH_CACHE_MAX_ENTRIES:
                    cache.pop(next(iter(cache)))  # the oldest entry
            cache[digest] = now + AUTH_CACHE_SECONDS
        return ok


@dataclass(frozen=True)
class WebConfig:
    """A loaded web config. `authorize()` is True for every request when no users are configured."""

    path: str = ""
    tls: TlsServerConfig | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)
    admin_users: Mapping[str, str] = field(default_factory=dict)
    admin_client_cert_subjects: frozenset[str] = frozenset()
    allowed_hosts: frozenset[str] = frozenset()  # lower case; an entry without a port allows any port
    allowed_origins: frozenset[str] = frozenset()  # lower case, scheme://host[:port]
    _auth: _BasicAuth | None = field(default=None, repr=False, compare=False)
    _tls_context: _ReloadingContext | None = field(default=None, repr=False, compare=False)

    @property
    def auth_required(self) -> bool:
        """Whether requests need basic-auth credentials (scrape or admin users are configured)."""
        return self._auth is not None

    @property
    def admin_identity_required(self) -> bool:
        """Whether admin POSTs need an admin user or subject (else they follow --web.enable-admin-api)."""
        return self._auth is not None or bool(self.admin_client_cert_subjects)

    def is_admin(self, user: str | None, cert_subject: str | None) -> bool:
        """Whether an authenticated basic-auth `user` or a verified client certificate's subject is an admin."""
        return (user is not None and user in self.admin_users) or (
            cert_subject is not None and cert_subject in self.admin_client_cert_subjects
        )

    def host_allowed(self, host: str) -> bool:
        """Whether a request's Host header is served: any when no allow list is configured."""
        if not self.allowed_hosts:
            return True
        host = host.strip().lower()
        name = host.rsplit(":", 1)[0] if host.rsplit(":", 1)[-1].isdigit() and not host.endswith("]") else host
        return host in self.allowed_hosts or name in self.allowed_hosts

    def origin_allowed(self, origin: str) -> bool:
        return origin.strip().lower().rstrip("/") in self.allowed_origins

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context to wrap the listening socket with, or None for plain HTTP."""
        return self._tls_context.context if self._tls_context else None

    def authorize(self, headers: Any) -> bool:
        """Check the request's `Authorization: Basic` header (any mapping with case-insensitive `.get`)."""
        if self._auth is None:
            return True
        credentials = parse_basic_authorization(headers.get("Authorization"))
        if credentials is None:
            return False
        return self._auth.check(*credentials)

    def authorize_cached(self, headers: Any) -> bool | None:
        """`authorize`'s answer when it needs no bcrypt check (no users, no or a malformed header, a pair
        checked recently), else None. Never waits, so the HTTP server can ask it on its event loop."""
        if self._auth is None:
            return True
        credentials = parse_basic_authorization(headers.get("Authorization"))
        if credentials is None:
            return False
        return self._auth.cached(*credentials)


def parse_basic_authorization(value: str | None) -> tuple[str, str] | None:
    """`Basic dXNlcjpwYXNz` -> ("user", "pass"); None when absent or malformed."""
    if not value:
        return None
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


# --------------------------------------------------------------------------- parsing
def _resolve(base: Path, value: str) -> str:
    return str(value if os.path.isabs(value) else base / value)


def _parse_tls(raw: Any, base: Path, problems: list[str]) -> TlsServerConfig | None:
    p = "tls_server_config"
    if not isinstance(raw, dict):
        problems.append(f"{p}: must be a mapping, got {type(raw).__name__}")
        return None
    for key in raw:
        if key not in _TLS_KEYS:
            problems.append(f"{p}.{key}: unknown key (allowed: {', '.join(sorted(_TLS_KEYS))})")
    for key in _IGNORED_TLS_KEYS:
        if key in raw:
            log.warning("web config: %s.%s is ignored; Python's TLS defaults apply", p, key)

    def text(key: str, default: str = "") -> str:
        value = raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            problems.append(f"{p}.{key}: must be a string, got {value!r}")
            return default
        return value

    cert, key = text("cert_file"), text("key_file")
    if not cert:
        problems.append(f"{p}.cert_file: required")
    if not key:
        problems.append(f"{p}.key_file: required")
    auth = text("client_auth_type", "NoClientCert") or "NoClientCert"
    ca = text("client_ca_file")
    if auth in _UNVERIFIED_CLIENT_AUTH:
        problems.append(
            f"{p}.client_auth_type: {auth} (accept unverified client certificates) is not supported; "
            "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
        )
    elif auth not in CLIENT_AUTH_TYPES:
        problems.append(f"{p}.client_auth_type: must be one of {', '.join(CLIENT_AUTH_TYPES)}, got {auth!r}")
    elif auth != "NoClientCert" and not ca:
        problems.append(f"{p}.client_ca_file: required with client_auth_type {auth}")
    elif auth == "NoClientCert" and ca:
        problems.append(
            f"{p}.client_ca_file: set, but client_auth_type is NoClientCert (set "
            "RequireAndVerifyClientCert or VerifyClientCertIfGiven)"
        )
    versions = {}
    for k, default in (("min_version", "TLS12"), ("max_version", "")):
        v = text(k, default)
        if v in ("TLS10", "TLS11"):
            problems.append(f"{p}.{k}: {v} is insecure and not supported; use TLS12 or TLS13")
            v = default
        elif v and v not in TLS_VERSIONS:
            problems.append(f"{p}.{k}: must be TLS12 or TLS13, got {v!r}")
            v = default
        versions[k] = v
    if versions["max_version"] and versions["max_version"] < versions["min_version"]:
        problems.append(f"{p}.max_version: {versions['max_version']} is below min_version {versions['min_version']}")
    for name, value in (("cert_file", cert), ("key_file", key), ("client_ca_file", ca)):
        if value and (found := secret_files.problem(_resolve(base, value), secret_files.MAX_TLS_FILE_BYTES)):
            problems.append(f"{p}.{name}: {found}")
    if not (cert and key):
        return None
    return TlsServerConfig(
        cert_file=_resolve(base, cert),
        key_file=_resolve(base, key),
        client_auth_type=auth if auth in CLIENT_AUTH_TYPES else "NoClientCert",
        client_ca_file=_resolve(base, ca) if ca else "",
        **versions,
    )


def _parse_users(raw: Any, problems: list[str], key: str = "basic_auth_users") -> dict[str, str]:
    if not isinstance(raw, dict):
        problems.append(f"{key}: must be a mapping of user to bcrypt hash, got {type(raw).__name__}")
        return {}
    users = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"{key}.{user}: user names must be non-empty strings without ':'")
        elif not isinstance(hashed, str) or not _BCRYPT_RE.match(hashed):
            # never echo the value: it may be a plaintext password pasted by mistake
            problems.append(
                f"{key}.{user}: not a bcrypt hash ($2b$<cost>$...); make one with: htpasswd -nBC 12 '' | tr -d ':\\n'"
            )
        else:
            users[user] = hashed
    return users


def _parse_strings(
    raw: Any, key: str, problems: list[str], check: Callable[[str], str] | None = None
) -> frozenset[str]:
    """A list of non-empty strings; `check` returns a problem with one, or ""."""
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(v, str) and v.strip() for v in raw):
        problems.append(f"{key}: must be a list of non-empty strings")
        return frozenset()
    for value in raw:
        problem = check(value) if check else ""
        if problem:
            problems.append(f"{key}: {value!r}: {problem}")
    return frozenset(v.strip() for v in raw)


def _check_origin(value: str) -> str:
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or "/" in rest.rstrip("/"):
        return "want scheme://host[:port], as a browser sends in Origin"
    return ""


def parse_web_config(raw: Any, path: str = "") -> WebConfig:
    """Validate a loaded YAML document; relative file paths resolve against `path`'s directory."""
    problems: list[str] = []
    base = Path(path).resolve().parent if path else Path.cwd()
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([f"must be a mapping, got {type(raw).__name__}"], path)
    for key in raw:
        if key not in _TOP_KEYS:
            problems.append(f"{key}: unknown key (allowed: {', '.join(sorted(_TOP_KEYS))})")
    http_cfg = raw.get("http_server_config")
    if http_cfg is not None:
        if not isinstance(http_cfg, dict):
            problems.append("http_server_config: must be a mapping")
        else:
            problems += [
                f"http_server_config.{k}: unknown key (allowed: http2)" for k in http_cfg if k not in _HTTP_SERVER_KEYS
            ]
    tls = _parse_tls(raw["tls_server_config"], base, problems) if raw.get("tls_server_config") is not None else None
    users = _parse_users(raw["basic_auth_users"], problems) if raw.get("basic_auth_users") is not None else {}
    admins = _parse_users(raw["admin_users"], problems, "admin_users") if raw.get("admin_users") is not None else {}
    for user in users.keys() & admins.keys():
        if users[user] != admins[user]:
            problems.append(f"admin_users.{user}: also in basic_auth_users with another hash; one user, one password")
    subjects = _parse_strings(raw.get("admin_client_cert_subjects"), "admin_client_cert_subjects", problems)
    if subjects and (tls is None or tls.client_auth_type == "NoClientCert"):
        problems.append(
            "admin_client_cert_subjects: needs tls_server_config with client_auth_type VerifyClientCertIfGiven "
            "or RequireAndVerifyClientCert (and client_ca_file), so that certificates are verified"
        )
    hosts = _parse_strings(raw.get("allowed_hosts"), "allowed_hosts", problems)
    origins = _parse_strings(raw.get("allowed_origins"), "allowed_origins", problems, _check_origin)

    tls_context = None
    if tls is not None and not problems:
        try:
            tls_context = _ReloadingContext(tls)
        except secret_files.SecretFileError as exc:  # changed since the check above
            problems.append(f"tls_server_config: {exc}")
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"tls_server_config: cannot load certificate, key or CA: {exc}")
    if problems:
        raise ConfigError(problems, path)
    if (users or admins) and tls is None:
        log.warning("web config %s: basic auth without TLS sends passwords in the clear", path)
    if tls is not None:
        _warn_exposed_key(tls)
    everyone = {**users, **admins}
    return WebConfig(
        path=path,
        tls=tls,
        basic_auth_users=users,
        admin_users=admins,
        admin_client_cert_subjects=subjects,
        allowed_hosts=frozenset(h.lower() for h in hosts),
        allowed_origins=frozenset(o.lower().rstrip("/") for o in origins),
        _auth=_BasicAuth(everyone) if everyone else None,
        _tls_context=tls_context,
    )


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web config file. Raises ConfigError listing every problem."""
    path = str(path)
    return parse_web_config(read_yaml_file(path), path)
