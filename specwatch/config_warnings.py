"""What `check-config` warns about in a valid config: settings that work but leak a secret or will not do
what the operator expects. Warnings, never errors: the daemon runs with them.

1. `inline_secrets`: `credentials:` or `password:` written into the config instead of a `*_file`, so the
   secret is as readable as the config file and travels with every copy of it.
2. `unmapped_gpu_routes`: routes without `gpus:` while the daemon runs under a dedicated user. The GPU
   auto-mapping finds the processes behind a route's port, which that user sees only for engines running as
   itself, and never for engines inside containers (another network namespace): their GPUs stay unknown.
3. `exposed_secret_files`: a password, token or TLS key file that is world-readable, or group-readable by a
   group other than the daemon's own (the daemon logs the same once per file when it first reads it).
4. `routes_past_scrape_threads`: more routes (plus the GPU source) than the scrape pool has threads under the
   unit's task limit. Calls past the cap queue; while slow or hung engines hold the threads, the routes whose
   calls never start by the cycle's deadline are down with reason `overloaded`.
"""

from __future__ import annotations

import os
import pwd

from specwatch import secret_files
from specwatch.config_schema import Config, HttpClientConfig

# The account the shipped systemd unit runs as (`User=` in systemd/specwatch.service).
SERVICE_USER = "specwatch"


def _inline(http: HttpClientConfig, where: str) -> list[str]:
    found = []
    if http.authorization is not None and http.authorization.credentials:
        found.append(
            f"{where}.authorization.credentials: an inline secret, readable by whoever reads the config; "
            "put it in a file readable only by the service user and give credentials_file"
        )
    if http.basic_auth is not None and http.basic_auth.password:
        found.append(
            f"{where}.basic_auth.password: an inline secret, readable by whoever reads the config; "
            "put it in a file readable only by the service user and give password_file"
        )
    return found


def inline_secrets(cfg: Config) -> list[str]:
    """One warning per inline secret, at the place it is written: `scrape` for the defaults, a route only where
    it sets its own (a route that inherits `scrape:`'s is covered by the warning about `scrape`); the same for
    `detection.seed_from` and a route's own."""
    found = _inline(cfg.scrape.http, "scrape")
    for i, r in enumerate(cfg.routes):
        own = HttpClientConfig(
            authorization=r.http.authorization if r.http.authorization != cfg.scrape.http.authorization else None,
            basic_auth=r.http.basic_auth if r.http.basic_auth != cfg.scrape.http.basic_auth else None,
        )
        found += _inline(own, f"routes[{i}] ({r.name})")
    top = cfg.detection.seed_from
    if top is not None:
        found += _inline(top.http, "detection.seed_from")
    for i, r in enumerate(cfg.routes):
        seed = r.detection.seed_from
        if seed is not None and seed != top:
            found += _inline(seed.http, f"routes[{i}] ({r.name}).detection.seed_from")
    return found


def dedicated_user() -> str:
    """The dedicated account the daemon runs as on this host ("" if none): the unit's user, when it exists."""
    try:
        return pwd.getpwnam(SERVICE_USER).pw_name
    except KeyError:
        return ""


def unmapped_gpu_routes(cfg: Config, user: str) -> list[str]:
    """Routes whose GPUs are left to the auto-mapping while the daemon runs as `user` ("" when it does not run
    under a dedicated user, or NVML is off: nothing to warn about)."""
    if not user or cfg.gpu.enabled == "false":
        return []
    return [
        f"routes[{i}] ({r.name}): no gpus: while specwatch runs as user {user}; the GPU auto-mapping finds only "
        f"engines running as {user} itself (or all, with CAP_SYS_PTRACE: docs/service.md), never engines in "
        "containers: set gpus: to the engine's GPU indexes"
        for i, r in enumerate(cfg.routes)
        if r.gpus is None
    ]


def _secret_paths(http: HttpClientConfig) -> list[str]:
    files = [
        http.tls_config.key_file,
        http.authorization.credentials_file if http.authorization else "",
        http.basic_auth.password_file if http.basic_auth else "",
    ]
    return [f for f in files if f]


def exposed_secret_files(cfg: Config, gid: int) -> list[str]:
    """One warning per secret file (wherever the config names it, once) that others than the daemon can read;
    `gid` is the daemon's group."""
    clients = [cfg.scrape.http, *(r.http for r in cfg.routes)]
    clients += [s.http for s in (cfg.detection.seed_from, *(r.detection.seed_from for r in cfg.routes)) if s]
    paths = dict.fromkeys(p for http in clients for p in _secret_paths(http))
    return [f"secret file {w}" for w in (secret_files.exposure(p, gid) for p in paths) if w]


def daemon_gid(user: str) -> int:
    """The group the daemon runs as: `user`'s primary group, or this process's where `user` is "" or unknown."""
    try:
        return pwd.getpwnam(user).pw_gid if user else os.getegid()
    except KeyError:
        return os.getegid()


def routes_past_scrape_threads(cfg: Config, scrape_threads: int) -> list[str]:
    """One warning when the routes and the GPU source outnumber `scrape_threads` (0: no cap known)."""
    calls = len(cfg.routes) + (cfg.gpu.enabled != "false")
    if not scrape_threads or calls <= scrape_threads:
        return []
    return [
        f"{len(cfg.routes)} routes: more scrape calls a cycle ({calls}) than the {scrape_threads} scrape threads the "
        "unit's TasksMax allows; calls past that wait in a queue, and while slow or hung engines hold the threads, "
        "routes whose call has not started by the cycle's deadline are down (reason overloaded): split the routes "
        "across agents, or raise TasksMax in a drop-in"
    ]


def warnings(cfg: Config, user: str | None = None, scrape_threads: int = 0) -> list[str]:
    """Every warning about `cfg`; `user` is the account the daemon runs as (default: `dedicated_user()`),
    `scrape_threads` the scrape pool's cap (0: not checked)."""
    user = dedicated_user() if user is None else user
    return (
        inline_secrets(cfg)
        + unmapped_gpu_routes(cfg, user)
        + exposed_secret_files(cfg, daemon_gid(user))
        + routes_past_scrape_threads(cfg, scrape_threads)
    )
