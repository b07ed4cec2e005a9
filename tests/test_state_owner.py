"""Commands that write the state store refuse to run as anyone but the state directory's owner, and say how to
run them instead: a root-owned SQLite journal in the daemon's directory would stop the daemon writing it."""

from __future__ import annotations

import os

from specwatch.cli import main as cli_main
from specwatch.commands import _owner


def someone_else(monkeypatch, directory) -> None:
    monkeypatch.setattr(_owner.os, "geteuid", lambda: os.stat(directory).st_uid + 1)


def test_baseline_accept_and_reset_refuse_another_user_and_name_the_command_to_run(tmp_path, monkeypatch, capsys):
    someone_else(monkeypatch, tmp_path)
    owner = _owner._name(os.stat(tmp_path).st_uid)
    for action in ("accept", "reset"):
        assert cli_main(["baseline", "--state.dir", str(tmp_path), action, "chat"]) == 1
        err = capsys.readouterr().err
        assert f"{tmp_path} belongs to user {owner}" in err
        assert f"Run as: sudo -u {owner} specwatch baseline --state.dir {tmp_path} {action} chat" in err
    assert list(tmp_path.iterdir()) == []  # nothing written
    # Reading is anyone's business.
    assert cli_main(["baseline", "--state.dir", str(tmp_path), "list"]) == 1  # no state file yet
    assert "belongs to" not in capsys.readouterr().err


def test_the_owner_may_write_and_a_missing_directory_is_left_to_the_command(tmp_path):
    assert _owner.not_owner_message(str(tmp_path), ["baseline", "accept", "chat"]) == ""
    assert _owner.not_owner_message(str(tmp_path / "nowhere"), ["baseline", "accept", "chat"], euid=12345) == ""
    message = _owner.not_owner_message(str(tmp_path), ["probe", "chat", "--adopt"], euid=os.stat(tmp_path).st_uid + 1)
    assert message.endswith("specwatch probe chat --adopt")


def test_probe_adopt_refuses_another_user_before_probing(tmp_path, monkeypatch, capsys):
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "specwatch.yml"
    # Port 9 (discard): were the round sent, it would fail; the refusal comes first.
    config.write_text(f"state_dir: {state}\nroutes:\n  - {{name: chat, url: 'http://127.0.0.1:9/metrics'}}\n")
    someone_else(monkeypatch, state)
    assert cli_main(["probe", "chat", "--config.file", str(config), "--adopt"]) == 1
    err = capsys.readouterr().err
    assert f"specwatch probe chat --config.file {config} --adopt" in err and "sudo -u" in err
