"""Hostile and careless config files: each is refused with a short message naming its path, `check-config`
refuses everything `run` would fail on, and a reload that fails for any reason keeps the running config."""

from __future__ import annotations

import logging

import pytest

from specwatch.cli import main as cli_main
from specwatch.commands import run as run_command
from specwatch.config import Config, ConfigError, load_config, parse_config

ROUTE = {"name": "chat", "url": "http://127.0.0.1:8000/metrics"}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.problems


def alias_bomb(levels: int, key: str = "interval") -> str:
    """`levels` anchors, each a list of nine aliases of the one before: 9**levels strings once expanded."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    lines.append(f"{key}: *l{levels - 1}")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "a malformed IPv6 URL": "routes:\n  - {name: chat, url: 'http://[::1/metrics'}\n",
    "a port out of range": "routes:\n  - {name: chat, url: 'http://127.0.0.1:99999/metrics'}\n",
    "a 400-digit number": "scrape:\n  max_body_bytes: " + "9" * 400 + "\n",
    "deeply nested YAML": "routes: " + "[" * 2000 + "]" * 2000 + "\n",
    "an interval past any datetime": "interval: 99999999999999999999d\n",
    "an alias bomb": alias_bomb(6),
    "a duplicate key": "interval: 5s\ninterval: 10s\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_check_config_refuses_each_hostile_file_with_a_short_message(name, tmp_path, capsys):
    path = tmp_path / "specwatch.yml"
    path.write_text(HOSTILE[name])
    assert cli_main(["check-config", "--config.file", str(path)]) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and len(err) < 2000, err[:2000]


class FakeDaemon:
    def __init__(self) -> None:
        self.failed = 0
        self.reloaded: list[Config] = []

    def reload_failed(self) -> None:
        self.failed += 1

    def reload(self, config: Config) -> None:
        self.reloaded.append(config)


class FakeScheduler:
    def __init__(self) -> None:
        self.jobs: list[dict] = []

    def add_job(self, *args, **kwargs) -> None:
        self.jobs.append(kwargs)


def reload_with(path, text: str) -> tuple[run_command.Service, FakeDaemon, Config]:
    path.write_text("interval: 5s\nroutes:\n  - {name: chat, url: 'http://127.0.0.1:8000/metrics'}\n")
    running = load_config(path)
    service = run_command.Service(running, str(path), "127.0.0.1:0", None)
    path.write_text(text)
    daemon = FakeDaemon()
    service._do_reload(daemon, FakeScheduler(), lambda _s: None, None)  # type: ignore[arg-type]
    return service, daemon, running


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_file_on_reload_keeps_the_running_config(name, tmp_path):
    service, daemon, running = reload_with(tmp_path / "specwatch.yml", HOSTILE[name])
    assert service.config is running
    assert daemon.failed == 1 and daemon.reloaded == []


def test_a_reload_that_fails_for_any_reason_keeps_the_running_config_and_logs_one_line(tmp_path, monkeypatch, caplog):
    def broken(_path):
        raise RuntimeError("x" * 100_000)

    monkeypatch.setattr(run_command, "load_config", broken)
    with caplog.at_level(logging.ERROR, logger="specwatch"):
        service, daemon, running = reload_with(tmp_path / "specwatch.yml", "interval: 5s\n")
    assert service.config is running and daemon.failed == 1 and daemon.reloaded == []
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "reload rejected" in record.getMessage() and len(record.getMessage()) < 400


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    path = tmp_path / "bomb.yml"
    path.write_text(alias_bomb(9))  # 9**9 strings once expanded: gigabytes if anything walked it
    assert len(path.read_bytes()) < 600
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "aliases are expanded" in str(info.value) and len(str(info.value)) < 300


def test_too_many_aliases_are_refused(tmp_path):
    path = tmp_path / "aliases.yml"
    path.write_text("x: &x 1\nl: [" + ", ".join(["*x"] * 500) + "]\n")
    with pytest.raises(ConfigError, match="more than 100 aliases"):
        load_config(path)


def test_a_file_past_the_size_bound_is_refused_unread(tmp_path):
    path = tmp_path / "big.yml"
    path.write_text("# " + "x" * (2 << 20) + "\n")  # 2 MiB of comment
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def test_errors_quote_a_short_excerpt_of_a_long_value():
    found = problems({"interval": "x" * 100_000, "routes": [{**ROUTE, "engine": ["y"] * 100_000}]})
    assert any(p.startswith("interval: not a duration") for p in found), found
    assert any(p.startswith("routes[0].engine: must be a string") for p in found), found
    assert all(len(p) < 200 for p in found), [len(p) for p in found]


@pytest.mark.parametrize(
    "raw, want",
    [
        ({"routes": [{**ROUTE, "name": "chat\n"}]}, "routes[0].name: only letters, digits and _.:- are allowed"),
        ({"interval": 1e-7}, "interval: must be at least 0.1s"),
        ({"interval": "2h"}, "interval: must be at most 3600s"),
        ({"detection": {"pin_duration": "99999d"}}, "detection.pin_duration: must be at most"),
        ({"routes": [{**ROUTE, "url": "http://127.0.0.1:99999/metrics"}]}, "routes[0].url: not a valid URL"),
        ({"routes": [{**ROUTE, "url": "http://[::1/metrics"}]}, "routes[0].url: not a valid URL"),
        ({"otlp": {"endpoint": "http://c:70000/v1/metrics"}}, "otlp.endpoint: not a valid URL"),
        ({"scrape": {"max_body_bytes": 10**400}}, "scrape.max_body_bytes: must be a number of at most"),
        ({"detection": {"cusum_threshold": 10**400}}, "detection.cusum_threshold: must be a number of at most"),
    ],
)
def test_validation_gaps_are_closed_with_the_path_named(raw, want):
    found = problems(raw)
    assert any(p.startswith(want) for p in found), (want, found)


def test_a_duplicate_key_names_its_path(tmp_path):
    path = tmp_path / "dup.yml"
    path.write_text("routes:\n  - name: chat\n    url: http://127.0.0.1:8000/metrics\n    name: code\n")
    with pytest.raises(ConfigError, match=r"routes\[0\]\.name: duplicate key 'name'"):
        load_config(path)
