"""The process's log output: `--log.level` and `--log.format` (logfmt or json, as Prometheus's own
`--log.format` offers), accepted before or after the subcommand. Under systemd the journal stamps every line
itself (JOURNAL_STREAM is set), so the time is left out there."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any

LEVELS = ("debug", "info", "warn", "error")
FORMATS = ("logfmt", "json")
_HANDLER_NAME = "specwatch"
_DEFAULTS = {"log_level": "info", "log_format": "logfmt"}


def add_flags(parser: argparse.ArgumentParser, *, on_subcommand: bool) -> None:
    """The log flags. On a subcommand their default is SUPPRESS, so a value given before the subcommand is not
    overwritten by the subparser's default (argparse copies subparser defaults over the parent's)."""
    level_default = argparse.SUPPRESS if on_subcommand else _DEFAULTS["log_level"]
    format_default = argparse.SUPPRESS if on_subcommand else _DEFAULTS["log_format"]
    parser.add_argument(
        "--log.level", dest="log_level", default=level_default, choices=LEVELS, help="log level (default info)"
    )
    parser.add_argument(
        "--log.format",
        dest="log_format",
        default=format_default,
        choices=FORMATS,
        help="log line format (default logfmt)",
    )


def _stamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _level(record: logging.LogRecord) -> str:
    return {"WARNING": "warn", "CRITICAL": "error"}.get(record.levelname, record.levelname.lower())


def _logfmt_value(value: str) -> str:
    if value and not any(c in value for c in ' "=\\\n\t'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


class LogfmtFormatter(logging.Formatter):
    """`ts=... level=info logger=specwatch.daemon msg="..."`, one line per record (tracebacks folded in)."""

    def __init__(self, with_time: bool) -> None:
        super().__init__()
        self.with_time = with_time

    def format(self, record: logging.LogRecord) -> str:
        fields: list[tuple[str, str]] = []
        if self.with_time:
            fields.append(("ts", _stamp(record)))
        fields += [("level", _level(record)), ("logger", record.name), ("msg", record.getMessage())]
        if record.exc_info:
            fields.append(("err", self.formatException(record.exc_info)))
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields)


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the same keys as logfmt."""

    def __init__(self, with_time: bool) -> None:
        super().__init__()
        self.with_time = with_time

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {}
        if self.with_time:
            doc["ts"] = _stamp(record)
        doc.update(level=_level(record), logger=record.name, msg=record.getMessage())
        if record.exc_info:
            doc["err"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure(args: argparse.Namespace) -> None:
    """Set up the root logger from the parsed flags (the defaults where a parser left them out)."""
    level_name = getattr(args, "log_level", _DEFAULTS["log_level"])
    fmt = getattr(args, "log_format", _DEFAULTS["log_format"])
    with_time = not os.environ.get("JOURNAL_STREAM")
    formatter: logging.Formatter = JsonFormatter(with_time) if fmt == "json" else LogfmtFormatter(with_time)
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)  # ours from an earlier call in this process
    if root.handlers:  # as logging.basicConfig: a host that set up logging (pytest, an embedder) keeps its own
        return
    root.addHandler(handler)
    root.setLevel({"warn": "WARNING"}.get(level_name, level_name.upper()))
