"""What the daemon's HTTP server needs of the baselines API (`GET /api/v1/baselines`, `POST
/api/v1/baselines/{route}/accept|reset|adopt`): its path, who is calling, its answer, the actions it calls,
and the HTTP-side rules of an admin POST (which requests are one, same-origin, the audit). The actions are the
CLI's own (commands/_admin.py), handed to the server by `specwatch run`, so export never imports them."""

from __future__ import annotations

import json
import logging
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from specwatch.export.prometheus import AdminRequests

log = logging.getLogger(__name__)

PREFIX = "/api/v1/baselines"
# The `action` label of specwatch_admin_requests_total; a path naming anything else counts as "other", so a
# client cannot grow the series.
KNOWN_ACTIONS = ("accept", "reset", "adopt")
# Its `outcome` label: performed (the action answered 2xx), failed (the action answered otherwise), and the
# server's refusals before the action runs.
OUTCOMES = ("performed", "failed", "unauthorized", "forbidden", "cross_origin", "misdirected", "bad_request")
MAX_LOGGED_NAME = 200  # a route or action named in an audit line; the path is the client's


@dataclass(frozen=True)
class Caller:
    """Who asked: the basic-auth user or the client certificate's subject (None without either), and the
    client's address as host:port."""

    user: str | None
    remote: str


@dataclass(frozen=True)
class Answer:
    """The status and JSON document of an action. A document may carry "before" and "after" (the state the
    action changed), which the server's audit log line records."""

    status: int
    document: dict[str, Any]


class BaselineActions(Protocol):
    enabled_without_auth: bool

    def act(self, route: str, action: str, caller: Caller, body: dict[str, Any]) -> Answer:
        """Run `action` on `route` for `caller`; `body` is the request's JSON object ({} when empty). The server
        has checked the caller is an admin."""

    def listing(self) -> Answer: ...


def admin_target(method: str, raw_path: str) -> tuple[str, str] | None:
    """(route, action) of an admin POST to /api/v1/baselines/{route}/{action}, else None."""
    if method != "POST" or not raw_path.startswith(PREFIX + "/"):
        return None
    parts = raw_path[len(PREFIX) :].strip("/").split("/")
    if len(parts) != 2 or not parts[0]:
        return None
    return urllib.parse.unquote(parts[0]), parts[1]


def remote_address(client: Any) -> str:
    """An ASGI scope's `client` (host, port) as host:port ([host]:port for IPv6); "" when unknown."""
    if not client:
        return ""
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser's Origin (scheme://host[:port]) names the host the request was sent to."""
    scheme, sep, netloc = origin.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or not host:
        return False  # "null" (a sandboxed page, a file) included
    default = {"http": ":80", "https": ":443"}[scheme]
    return netloc.rstrip("/").removesuffix(default) == host.strip().lower().removesuffix(default)


class Audit:
    """One request's audit, when it is an admin POST (`target` not None): a log line at INFO (user, remote
    address, action, route, status, outcome and the action's before/after) and its count in
    specwatch_admin_requests_total. Nothing for other requests."""

    def __init__(self, counts: AdminRequests, target: tuple[str, str] | None, remote: str) -> None:
        self.counts, self.target, self.remote = counts, target, remote
        self.user: str | None = None

    def answered(self, answer: Answer) -> None:
        outcome = "performed" if 200 <= answer.status < 300 else "failed"
        self.record(answer.status, outcome, answer.document.get("before"), answer.document.get("after"))

    def record(self, status: int, outcome: str, before: Any = None, after: Any = None) -> None:
        if self.target is None:
            return
        route, action = self.target
        assert outcome in OUTCOMES, outcome
        self.counts.count(action if action in KNOWN_ACTIONS else "other", outcome)
        log.info(
            "admin request: user=%s remote=%s action=%s route=%s status=%d outcome=%s before=%s after=%s",
            json.dumps(self.user),
            self.remote,
            json.dumps(action[:MAX_LOGGED_NAME]),
            json.dumps(route[:MAX_LOGGED_NAME]),
            status,
            outcome,
            json.dumps(before, sort_keys=True, default=str),
            json.dumps(after, sort_keys=True, default=str),
        )
