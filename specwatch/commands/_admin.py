"""The baselines API of the daemon's HTTP server (export/admin_api.py routes the requests here), so that one
command (`specwatch fleet accept`) or an Alertmanager webhook reaches every node.

1. `POST /api/v1/baselines/{route}/accept`, body `{"model", "engine_version"?, "draft_length"?, "dry_run"?}`:
   decided on the daemon's live state, between two cycles (`Daemon.with_route`), by the route's acceptance
   detector (evaluators/accept.py): 200 with the outcome ("adopted", "already", "would_adopt"), or 409
   "refused" with the reason and nothing changed (the route runs another key, has no evidence yet, its
   engine is down...). Never deletes a baseline.
2. `POST /api/v1/baselines/{route}/reset`, body `{"confirm": "<route>"}`: the one action that deletes, and only
   when the body names the route (400 otherwise); 200 with what was deleted.
3. `POST /api/v1/baselines/{route}/adopt`: queues the canary's adopt (the next probe round becomes the current
   key's fingerprint); 202, since the round is yet to run.
4. `GET /api/v1/baselines` lists the stored baselines, and the fields accept takes (`accept_fields`): a client
   checks it first, since a daemon that predates them would take any accept as the old one (which deleted).

The write endpoints are admin endpoints, off by default as Prometheus's are: they answer when the web config
has basic auth (a request without valid credentials gets 401 before it gets here), or, without auth, only
when the daemon was started with `--web.enable-admin-api`; otherwise 403.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from specwatch.config import Config
from specwatch.daemon import LiveRoute
from specwatch.evaluators.accept import REFUSED, AcceptOutcome, Expected, baseline_document
from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator
from specwatch.export.admin_api import Answer, Caller
from specwatch.state.commands import ACTIONS
from specwatch.state.store import DB_NAME, StateStore

log = logging.getLogger(__name__)

T = TypeVar("T")
ACCEPT_FIELDS = {"model": str, "engine_version": str, "draft_length": int, "drafter": str, "dry_run": bool}


class LiveRoutes(Protocol):
    """The running daemon, as the admin actions reach it (daemon.Daemon)."""

    def with_route(self, name: str, fn: Callable[[LiveRoute], T]) -> T: ...


class BadRequest(ValueError):
    """A request body the action cannot take (400)."""


def parse_accept(body: dict[str, Any]) -> tuple[Expected, bool]:
    """(what the route must run, dry run) from an accept's JSON body; BadRequest names every problem."""
    problems = [f"unknown field {name!r}" for name in sorted(body) if name not in ACCEPT_FIELDS]
    for name, kind in ACCEPT_FIELDS.items():
        value = body.get(name)
        if value is None:
            continue
        # bool is an int in Python: a draft length of `true` is a mistake, not k=1
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(f"{name} must be a JSON {'string' if kind is str else kind.__name__}, not {value!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        problems.append('"model" is required: the model the route must run for its baseline to be adopted')
    k = body.get("draft_length")
    if isinstance(k, int) and not isinstance(k, bool) and k < 1:
        problems.append(f"draft_length must be at least 1, not {k}")
    if problems:
        raise BadRequest("; ".join(problems))
    version, drafter = body.get("engine_version"), body.get("drafter")
    expected = Expected(
        str(model),
        version if isinstance(version, str) else None,
        k,
        drafter if isinstance(drafter, str) else None,
    )
    return expected, bool(body.get("dry_run"))


class BaselineAdmin:
    """Operator actions on the running daemon: `get_config` gives the config in use (after reloads), `live` the
    daemon whose loop decides them."""

    def __init__(self, get_config: Callable[[], Config], live: LiveRoutes, enabled_without_auth: bool = False) -> None:
        self.get_config = get_config
        self.live = live
        self.enabled_without_auth = enabled_without_auth

    def act(self, route: str, action: str, caller: Caller, body: dict[str, Any]) -> Answer:
        """Run `action` on `route` (blocking: it waits for the loop's current cycle); the caller has checked
        authorization."""
        config = self.get_config()
        routes = {r.name: r for r in config.routes}
        if action not in ACTIONS:
            return Answer(404, {"error": f"unknown action {action!r}; one of {', '.join(ACTIONS)}"})
        if route not in routes:
            return Answer(404, {"error": f"unknown route {route!r}"})
        try:
            if action == "accept":
                expected, dry_run = parse_accept(body)
                answer = self._accept(route, expected, dry_run)
            elif action == "reset":
                answer = self._reset(route, body)
            else:
                answer = self._adopt(config, route, body)
        except BadRequest as exc:
            answer = Answer(400, {"route": route, "action": action, "error": str(exc)})
        level = logging.INFO if answer.status < 300 else logging.WARNING
        what = answer.document.get("message") or answer.document.get("reason") or answer.document.get("error")
        log.log(level, "baselines API: %s %s by %s: %s", action, route, caller.user or caller.remote, what)
        return answer

    def _accept(self, route: str, expected: Expected, dry_run: bool) -> Answer:
        def decide(live: LiveRoute) -> AcceptOutcome:
            detector = _detector(live)
            if detector is None:
                return AcceptOutcome(REFUSED, f"route {route}: its acceptance detector is not running (see the log)")
            if live.last_reason:
                before = detector.reference_document()
                reason = f"route {route}: its engine's last scrape failed ({live.last_reason}): what it runs is unknown"
                return AcceptOutcome(REFUSED, reason, before, before)
            return detector.accept(expected, live.now, dry_run)

        try:
            outcome = self.live.with_route(route, decide)
        except KeyError:  # removed by a reload since the config was read
            return Answer(404, {"error": f"unknown route {route!r}"})
        document: dict[str, Any] = {
            "route": route,
            "action": "accept",
            "outcome": outcome.outcome,
            "before": outcome.before,
            "after": outcome.after,
        }
        if outcome.refused:
            document["reason"] = outcome.reason
            return Answer(409, document)
        document["message"] = outcome.reason
        return Answer(200, document)

    def _reset(self, route: str, body: dict[str, Any]) -> Answer:
        if set(body) - {"confirm"} or body.get("confirm") != route:
            raise BadRequest(
                f"reset deletes every baseline of route {route!r} and it relearns from scratch: "
                f'send the body {{"confirm": "{route}"}} to confirm'
            )

        def reset(live: LiveRoute) -> tuple[bool, list[dict[str, Any]]] | None:
            detector = _detector(live)
            return None if detector is None else detector.reset()

        try:
            done = self.live.with_route(route, reset)
        except KeyError:
            return Answer(404, {"error": f"unknown route {route!r}"})
        if done is None:
            return Answer(
                409, {"route": route, "action": "reset", "outcome": REFUSED, "reason": "no acceptance detector"}
            )
        written, deleted = done
        if not written:
            return Answer(500, {"route": route, "action": "reset", "error": "the state file could not be written"})
        return Answer(
            200,
            {
                "route": route,
                "action": "reset",
                "outcome": "reset",
                "before": deleted,
                "after": [],
                "message": f"route {route}: {len(deleted)} baseline(s) and the detector state deleted; it relearns",
            },
        )

    def _adopt(self, config: Config, route: str, body: dict[str, Any]) -> Answer:
        if body:
            raise BadRequest(f"adopt takes no fields, got {', '.join(sorted(body))}")
        if next(r for r in config.routes if r.name == route).probe is None:
            return Answer(409, {"error": f"route {route!r} has no canary probe configured"})
        errors: list[str] = []
        store = StateStore(str(Path(config.state_dir) / DB_NAME), errors, repair=False)
        try:
            ok = store.append_command(route, "adopt")
        finally:
            store.close()
        if not ok:
            detail = "; ".join(errors) or "the state store refused the write"
            return Answer(500, {"route": route, "action": "adopt", "error": detail})
        message = f"route {route}: the next canary round becomes the fingerprint of the current model"
        return Answer(202, {"route": route, "action": "adopt", "status": "queued", "message": message})

    def listing(self) -> Answer:
        """Every stored baseline (GET /api/v1/baselines)."""
        config = self.get_config()
        path = Path(config.state_dir) / DB_NAME
        fields = sorted(ACCEPT_FIELDS)
        if not path.exists():
            return Answer(200, {"baselines": [], "accept_fields": fields})
        errors: list[str] = []
        store = StateStore(str(path), errors, readonly=True, repair=False)
        try:
            rows = [baseline_document(b) for b in store.baselines()]
        finally:
            store.close()
        document: dict[str, Any] = {"baselines": rows, "accept_fields": fields}
        if errors:
            document["errors"] = errors
        return Answer(200, document)


def _detector(live: LiveRoute) -> AcceptanceDropEvaluator | None:
    return next((e for e in live.evaluators if isinstance(e, AcceptanceDropEvaluator)), None)
