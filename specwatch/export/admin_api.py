"""What the daemon's HTTP server needs of the baselines API (`GET /api/v1/baselines`, `POST
/api/v1/baselines/{route}/accept|reset|adopt`): its path, who is calling, its answer, and the actions it calls.
The actions are the CLI's own (commands/_admin.py), handed to the server by `specwatch run`, so export never
imports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

PREFIX = "/api/v1/baselines"
# The `action` label of specwatch_admin_requests_total; a path naming anything else counts as "other", so a
# client cannot grow the series.
KNOWN_ACTIONS = ("accept", "reset", "adopt")
# Its `outcome` label: performed (the action answered 2xx), failed (the action answered otherwise), and the
# server's refusals before the action runs.
OUTCOMES = ("performed", "failed", "unauthorized", "forbidden", "cross_origin", "misdirected", "bad_request")


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
