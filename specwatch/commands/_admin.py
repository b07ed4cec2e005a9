"""The baselines API of the daemon's HTTP server (export/admin_api.py routes the requests here): what
`specwatch baseline accept/reset` and a canary adopt do, over HTTP, so that one command or an Alertmanager
webhook reaches every node.

`POST /api/v1/baselines/{route}/accept|reset|adopt` runs the CLI's own functions (commands/baseline.py) on a
connection of its own to the state file, which queue the command that the daemon loop applies on its next
cycle: one code path, whichever way the operator came. `GET /api/v1/baselines` lists the stored baselines.

The write endpoints are admin endpoints, off by default as Prometheus's are: they answer when the web config
has basic auth (a request without valid credentials gets 401 before it gets here), or, without auth, only
when the daemon was started with `--web.enable-admin-api`; otherwise 403.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from specwatch.commands.baseline import accept_route, reset_route
from specwatch.config import Config
from specwatch.export.admin_api import Answer
from specwatch.state.commands import ACTIONS
from specwatch.state.store import DB_NAME, StateStore

log = logging.getLogger(__name__)


class BaselineAdmin:
    """Operator actions on the running daemon's config (`get_config`: the config in use, after reloads)."""

    def __init__(self, get_config: Callable[[], Config], enabled_without_auth: bool = False) -> None:
        self.get_config = get_config
        self.enabled_without_auth = enabled_without_auth

    def act(self, route: str, action: str, caller: object = None, body: object = None) -> Answer:
        """Run `action` on `route` (blocking: a SQLite transaction); the caller has checked authorization."""
        config = self.get_config()
        routes = {r.name: r for r in config.routes}
        if action not in ACTIONS:
            return Answer(404, {"error": f"unknown action {action!r}; one of {', '.join(ACTIONS)}"})
        if route not in routes:
            return Answer(404, {"error": f"unknown route {route!r}"})
        if action == "adopt" and routes[route].probe is None:
            return Answer(409, {"error": f"route {route!r} has no canary probe configured"})
        errors: list[str] = []
        store = StateStore(str(Path(config.state_dir) / DB_NAME), errors, repair=False)
        try:
            if action == "reset":
                ok, message = reset_route(store, route)
            elif action == "accept":
                ok, message = accept_route(store, route, routes[route].detection)
            else:
                ok = store.append_command(route, "adopt")
                message = f"route {route}: the next canary round becomes the fingerprint of the current model"
        finally:
            store.close()
        if not ok:
            detail = message or "; ".join(errors) or "the state store refused the write"
            log.warning("baselines API: %s %s refused: %s", action, route, detail)
            return Answer(409 if message else 500, {"route": route, "action": action, "error": detail})
        log.info("baselines API: %s", message)
        return Answer(202, {"route": route, "action": action, "status": "queued", "message": message})

    def listing(self) -> Answer:
        """Every stored baseline (GET /api/v1/baselines)."""
        config = self.get_config()
        path = Path(config.state_dir) / DB_NAME
        if not path.exists():
            return Answer(200, {"baselines": []})
        errors: list[str] = []
        store = StateStore(str(path), errors, readonly=True, repair=False)
        try:
            rows = [
                {
                    "route": b.route,
                    "model": b.key.model_name,
                    "engine_version": b.key.engine_version,
                    "draft_length": b.key.k,
                    "acceptance_ratio": b.acceptance_ratio,
                    "overdispersion": b.overdispersion,
                    "drafted_tokens": b.drafted_tokens,
                    "source": b.source,
                    "pinned": b.pinned,
                    "updated": b.updated,
                }
                for b in store.baselines()
            ]
        finally:
            store.close()
        return Answer(200, {"baselines": rows, "errors": errors} if errors else {"baselines": rows})
