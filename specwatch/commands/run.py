"""`specwatch run`: the daemon. Loads the config, serves HTTP, runs the evaluation loop, handles signals.

SIGHUP reloads the config (a bad file is rejected whole: the old config keeps running and
`specwatch_config_last_reload_successful` drops to 0); SIGTERM and SIGINT finish the current cycle, flush
state and exit 0. Under systemd (Type=notify) READY=1 follows the first completed cycle, and WATCHDOG=1 is
sent only after cycles that really completed, so a hung loop stops petting the watchdog.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from specwatch import __version__, systemd_notify
from specwatch.commands import add_config_file_argument
from specwatch.config import Config, ConfigError, load_config
from specwatch.daemon import Daemon
from specwatch.export import otel
from specwatch.commands._admin import BaselineAdmin
from specwatch.export.http import DEFAULT_LISTEN_ADDRESS, load_web_config, serve
from specwatch.export.prometheus import ExportErrors
from specwatch.scheduler import schedule, start_scheduler

log = logging.getLogger("specwatch")

# After an orderly stop, how long source calls still running (a hung NVML call, an engine's socket) get to finish
# before the process exits without them.
HUNG_CALL_GRACE_SECONDS = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(parser)
    parser.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=DEFAULT_LISTEN_ADDRESS,
        metavar="HOST:PORT",
        help=f"address for /metrics and the API (default {DEFAULT_LISTEN_ADDRESS})",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default="",
        metavar="FILE",
        help="TLS and basic auth settings, in the Prometheus exporter-toolkit format",
    )
    parser.add_argument(
        "--web.enable-admin-api",
        dest="enable_admin_api",
        action="store_true",
        help="serve POST /api/v1/baselines/ROUTE/accept|reset|adopt without basic auth (with basic auth in "
        "--web.config.file they are served anyway)",
    )


def log_config_error(exc: ConfigError, what: str) -> None:
    log.error("%s: %s has %d problem(s)", what, exc.source or "config", len(exc.problems))
    for problem in exc.problems:
        log.error("  %s", problem)


def start_otlp(config: Config, daemon: Daemon, errors: ExportErrors) -> otel.OtlpExport | None:
    """Start OTLP export when configured; None when not configured or when it cannot start."""
    if config.otlp is None:
        return None
    try:
        return otel.start_otlp(config.otlp, lambda: daemon.snapshot, errors)
    except Exception:  # noqa: BLE001 - a broken collector endpoint must not stop /metrics
        log.exception("starting OTLP export to %s failed; continuing without it", config.otlp.endpoint)
        return None


class Service:
    """The running daemon: owns the Daemon, HTTP server, scheduler and OTLP export, and reacts to signals."""

    def __init__(
        self, config: Config, config_file: str, listen_address: str, web_config: Any, enable_admin_api: bool = False
    ) -> None:
        self.config = config
        self.enable_admin_api = enable_admin_api
        self.config_file = config_file
        self.listen_address = listen_address
        self.web_config = web_config
        self._wake = threading.Event()
        self._stop = False
        self._reload = False

    def request_stop(self, *_: Any) -> None:
        self._stop = True
        self._wake.set()

    def request_reload(self, *_: Any) -> None:
        self._reload = True
        self._wake.set()

    def run(self) -> int:
        daemon = Daemon(self.config)
        self._export_errors = ExportErrors()  # one for /metrics and OTLP, so /metrics counts OTLP's failures
        try:
            admin = BaselineAdmin(lambda: daemon.config, daemon, self.enable_admin_api)
            server = serve(self.listen_address, lambda: daemon.snapshot, self.web_config, self._export_errors, admin)
        except (OSError, ValueError) as exc:
            log.error("cannot listen on %s: %s", self.listen_address, exc)
            daemon.close()
            return 1
        log.info(
            "specwatch %s listening on %s, %d route(s), every %gs",
            __version__,
            server.url,
            len(self.config.routes),
            self.config.interval_seconds,
        )
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)

        daemon.tick()
        systemd_notify.ready()
        systemd_notify.watchdog()
        watchdog_every = systemd_notify.watchdog_interval_seconds()
        if watchdog_every is not None and watchdog_every < self.config.interval_seconds:
            log.warning(
                "WatchdogSec/2 (%gs) is shorter than the interval (%gs): systemd will kill a healthy "
                "daemon; raise WatchdogSec",
                watchdog_every,
                self.config.interval_seconds,
            )

        def pet(_snapshot: object) -> None:
            systemd_notify.watchdog()

        scheduler = start_scheduler(daemon, self.config.interval_seconds, on_tick=pet)
        otlp = start_otlp(self.config, daemon, self._export_errors)

        while not self._stop:
            # Bounded: the handlers run on this same thread, and with an unbounded wait a SIGHUP was seen to go
            # unanswered on a loaded box (tests/test_cli_core.py); the flags are looked at every second anyway.
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if self._reload and not self._stop:
                self._reload = False
                otlp = self._do_reload(daemon, scheduler, pet, otlp)

        log.info("stopping: finishing the current cycle")
        systemd_notify.stopping()
        scheduler.shutdown(wait=True)
        if otlp is not None:
            otlp.shutdown()
        daemon.close()
        server.shutdown()
        hung = daemon.calls_running(timeout=HUNG_CALL_GRACE_SECONDS)
        log.info("stopped")
        # All is flushed. Python resets handlers to the default during its teardown, where a second SIGTERM (an
        # impatient operator, a test's stop()) would turn this exit 0 into death by signal.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if hung:
            exit_leaving_hung_calls(hung, 0)
        return 0

    def _do_reload(self, daemon: Daemon, scheduler: Any, pet: Any, otlp: Any) -> Any:
        """Adopt the config file again; a reload that fails for any reason keeps the running config."""
        systemd_notify.reloading()
        try:
            new = load_config(self.config_file)
        except ConfigError as exc:
            log_config_error(exc, "reload rejected, the previous configuration keeps running")
            daemon.reload_failed()
            systemd_notify.ready()
            return otlp
        except Exception as exc:  # noqa: BLE001 - whatever a file does to the loader, the daemon keeps running
            log.error(
                "reload rejected, the previous configuration keeps running: %s: %s",
                type(exc).__name__,
                str(exc)[:200],
            )
            daemon.reload_failed()
            systemd_notify.ready()
            return otlp
        old = self.config
        try:
            daemon.reload(new)
            if new.interval_seconds != old.interval_seconds:
                schedule(scheduler, daemon, new.interval_seconds, on_tick=pet)
        except Exception:  # noqa: BLE001 - a config that validated but cannot be applied: go back to the old one
            log.exception("reload failed while applying it; going back to the previous configuration")
            try:
                daemon.reload(old)
                schedule(scheduler, daemon, old.interval_seconds, on_tick=pet)
            except Exception:  # noqa: BLE001
                log.exception("restoring the previous configuration failed too")
            daemon.reload_failed()
            systemd_notify.ready()
            return otlp
        self.config = new
        if new.otlp != old.otlp:
            if otlp is not None:
                otlp.shutdown()
            otlp = start_otlp(new, daemon, self._export_errors)
        log.info("configuration reloaded from %s: %d route(s)", self.config_file, len(new.routes))
        systemd_notify.ready()
        return otlp


def exit_leaving_hung_calls(sources: list[str], code: int) -> None:
    """Exit now, without the interpreter's teardown: concurrent.futures joins every worker thread at exit, and a
    thread blocked in a C call (NVML) or a socket cannot be interrupted, so a normal exit would wait for the hung
    call, until systemd's stop timeout kills the process. Everything is flushed first."""
    log.warning(
        "exiting with %d source call(s) still hung after %gs (%s); not waiting for them",
        len(sources),
        HUNG_CALL_GRACE_SECONDS,
        ", ".join(sources),
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to flush
            pass
    os._exit(code)


def main(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config_file)
        web_config = load_web_config(args.web_config_file)
    except ConfigError as exc:
        log_config_error(exc, "cannot start")
        return 1
    return Service(config, args.config_file, args.listen_address, web_config, args.enable_admin_api).run()
