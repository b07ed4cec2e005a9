"""Secret files: a size cap, a re-read only on change, FIFOs and devices refused without blocking, and a warning
for files others can read, in `check-config` and once at run time."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

import pytest

from specwatch import secret_files
from specwatch.cli import main as cli_main
from specwatch.config import parse_config
from specwatch.config_schema import TlsConfig
from specwatch.secret_files import MAX_SECRET_BYTES, SecretFileError, exposure, read_secret
from specwatch.sources import http as scrape_http
from specwatch.sources.base import SourceError


def finishes(fn: Callable[[], Any], seconds: float = 20.0) -> Any:
    """Run `fn` on a thread: its result, or a failure (never a hang) when it blocks past `seconds`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} blocked for {seconds}s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "token.fifo"
    os.mkfifo(path)
    return str(path)


def test_a_fifo_is_refused_naming_the_file_without_waiting_for_a_writer(fifo):
    with pytest.raises(SecretFileError) as info:
        finishes(lambda: read_secret(fifo))
    assert str(info.value) == f"{fifo} is a FIFO, not a regular file: refused"


def test_a_device_is_refused_and_never_read():
    with pytest.raises(SecretFileError) as info:
        read_secret("/dev/zero")
    assert str(info.value) == "/dev/zero is a character device, not a regular file: refused"


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "token"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB by its size, nothing on disk
    with pytest.raises(SecretFileError) as info:
        read_secret(str(big))
    assert str(info.value) == f"{big} is {1 << 30} bytes, over the {MAX_SECRET_BYTES}-byte cap for this file: refused"


def test_a_secret_is_read_again_only_when_its_file_changed(tmp_path, monkeypatch):
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(secret_files.os, "open", lambda p, *a: opened.append(p) or real_open(p, *a))
    token = tmp_path / "token"
    token.write_text("one\n")
    assert [read_secret(str(token)) for _ in range(5)] == ["one"] * 5
    assert len(opened) == 1
    token.write_text("three\n")  # a new size
    assert read_secret(str(token)) == "three" and len(opened) == 2
    token.write_text("four\n")  # the same size: the new mtime tells
    os.utime(token, ns=(1, 2_000_000_000))
    assert read_secret(str(token)) == "four" and len(opened) == 3
    rotated = tmp_path / "token.new"
    rotated.write_text("five\n")
    os.utime(rotated, ns=(1, 2_000_000_000))  # same size and mtime as before: the new inode tells
    os.replace(rotated, token)
    assert read_secret(str(token)) == "five" and len(opened) == 4


def test_others_reading_a_secret_file_is_a_warning_but_the_daemons_group_is_not(tmp_path):
    token = tmp_path / "token"
    token.write_text("t")
    gid = os.stat(token).st_gid
    token.chmod(0o600)
    assert exposure(str(token), gid) == ""
    token.chmod(0o640)
    assert exposure(str(token), gid) == ""  # root:specwatch 0640, as docs/service.md gives keys to the daemon
    assert exposure(str(token), gid + 1) == (
        f"{token} is readable by group {gid}, not the daemon's own ({gid + 1}) (mode 0640): chmod g-r it, "
        "or give it to the daemon's group"
    )
    token.chmod(0o644)
    assert exposure(str(token), gid) == f"{token} is world-readable (mode 0644): chmod o-r it"


def _client(**route: Any) -> Any:
    return parse_config({"routes": [{"name": "r", "url": "http://127.0.0.1:9/metrics", **route}]}).routes[0].http


def test_a_fifo_credentials_file_fails_the_scrape_at_once_with_its_name(fifo):
    client = _client(authorization={"credentials_file": fifo})
    with pytest.raises(SourceError) as info:
        finishes(lambda: scrape_http._authorization_header(client, "http://127.0.0.1:9/metrics"))
    assert info.value.reason == "credentials"
    assert f"{fifo} is a FIFO, not a regular file: refused" in str(info.value)


def test_a_fifo_tls_file_is_refused_before_ssl_opens_it(fifo):
    context = scrape_http._TlsContext(TlsConfig(ca_file=fifo))
    with pytest.raises(SecretFileError, match="is a FIFO, not a regular file"):
        finishes(context.context)


def test_a_readable_secret_file_is_logged_once_at_run_time(tmp_path, caplog):
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    token.chmod(0o644)
    client = _client(basic_auth={"username": "u", "password_file": str(token)})
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.http"):
        for _ in range(3):
            assert scrape_http._authorization_header(client, "http://127.0.0.1:9/metrics")
    warnings = [r.getMessage() for r in caplog.records if "world-readable" in r.getMessage()]
    assert warnings == [f"secret file {token} is world-readable (mode 0644): chmod o-r it"]
    assert "t0k3n" not in caplog.text


def test_check_config_refuses_a_fifo_and_a_device_as_secret_files_without_hanging(tmp_path, fifo, capsys):
    path = tmp_path / "fifo.yml"
    path.write_text(
        "routes:\n"
        f"  - {{name: a, url: 'http://127.0.0.1:8000/metrics', authorization: {{credentials_file: {fifo}}}}}\n"
        "  - {name: b, url: 'http://127.0.0.1:8001/metrics', "
        "basic_auth: {username: u, password_file: /dev/zero}}\n"
    )
    assert finishes(lambda: cli_main(["check-config", "--config.file", str(path), "--service.user", ""])) == 0
    err = capsys.readouterr().err
    assert f"WARNING: a: authorization.credentials_file: {fifo} is a FIFO, not a regular file: refused" in err
    assert "WARNING: b: basic_auth.password_file: /dev/zero is a character device, not a regular file: refused" in err
    assert "readable" not in err  # refused already: no second warning about its mode


def test_check_config_warns_about_secret_files_others_can_read(tmp_path, capsys):
    token, key = tmp_path / "token", tmp_path / "client.key"
    for f in (token, key):
        f.write_text("x")
        f.chmod(0o644)
    path = tmp_path / "open.yml"
    path.write_text(
        "scrape: {authorization: {credentials_file: " + str(token) + "}}\n"
        "routes:\n"
        "  - {name: a, url: 'https://127.0.0.1:8000/metrics'}\n"
        f"  - {{name: b, url: 'https://127.0.0.1:8001/metrics', tls_config: {{cert_file: {key}, key_file: {key}}}}}\n"
    )
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if "world-readable" in x]
    assert warnings == [
        f"WARNING: secret file {token} is world-readable (mode 0644): chmod o-r it",
        f"WARNING: secret file {key} is world-readable (mode 0644): chmod o-r it",
    ]
