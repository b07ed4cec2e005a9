"""What the daemon's HTTP server needs of the baselines API (`GET /api/v1/baselines`, `POST
/api/v1/baselines/{route}/accept|reset|adopt`): its path, its answer, and the actions it calls. The actions are
the CLI's own (commands/_admin.py), handed to the server by `specwatch run`, so export never imports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

PREFIX = "/api/v1/baselines"


@dataclass(frozen=True)
class Caller:
    user: str | None
    remote: str


@dataclass(frozen=True)
class Answer:
    status: int
    document: dict[str, Any]


class BaselineActions(Protocol):
    enabled_without_auth: bool

    def act(self, route: str, action: str, caller: Caller, body: dict[str, Any]) -> Answer: ...

    def listing(self) -> Answer: ...
