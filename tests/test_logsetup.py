"""Log flags on every subcommand, and the logfmt / json line formats."""

from __future__ import annotations

import json
import logging

import pytest

from specwatch import cli, logsetup


@pytest.mark.parametrize(
    "argv",
    [
        ["--log.level=debug", "check-config", "--config.file", "x.yml"],
        ["check-config", "--log.level=debug", "--config.file", "x.yml"],
        ["check-config", "--config.file", "x.yml", "--log.level", "debug"],
    ],
)
def test_log_level_is_accepted_before_or_after_the_subcommand(argv):
    args = cli.build_parser(only="check-config").parse_args(argv)
    assert args.log_level == "debug"


def test_a_flag_before_the_subcommand_is_not_reset_by_the_subcommand_default():
    args = cli.build_parser(only="run").parse_args(["--log.format=json", "run", "--config.file", "x.yml"])
    assert args.log_format == "json"
    assert getattr(args, "log_level", "info") == "info"


def test_every_subcommand_takes_the_log_flags():
    for name in cli.COMMANDS:
        parser = cli.build_parser(only=name)
        sub = next(a for a in parser._actions if a.dest == "command").choices[name]
        flags = {opt for action in sub._actions for opt in action.option_strings}
        assert {"--log.level", "--log.format"} <= flags, name


def _record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("specwatch.daemon", level, __file__, 1, msg, (), None)


def test_logfmt_quotes_values_with_spaces_and_escapes_quotes():
    line = logsetup.LogfmtFormatter(with_time=False).format(_record('route "chat" down'))
    assert line == 'level=warn logger=specwatch.daemon msg="route \\"chat\\" down"'


def test_logfmt_has_a_timestamp_outside_the_journal_only():
    assert logsetup.LogfmtFormatter(with_time=True).format(_record("x")).startswith("ts=")
    assert not logsetup.LogfmtFormatter(with_time=False).format(_record("x")).startswith("ts=")


def test_json_lines_parse_and_carry_the_same_keys():
    doc = json.loads(logsetup.JsonFormatter(with_time=True).format(_record("hello\nworld", logging.ERROR)))
    assert doc["level"] == "error" and doc["msg"] == "hello\nworld" and doc["logger"] == "specwatch.daemon"
    assert doc["ts"].endswith("Z")


def test_configure_leaves_out_the_time_under_the_journal(monkeypatch):
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        root.handlers[:] = []
        logsetup.configure(cli.build_parser(only="status").parse_args(["status", "--log.format=logfmt"]))
        assert len(root.handlers) == 1 and not root.handlers[0].formatter.with_time
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
