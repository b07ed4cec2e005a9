"""`specwatch status` against a daemon behind `--web.config.file` (TLS and basic auth): credentials and the CA
come from `--http.config.file` (or `$SPECWATCH_HTTP_CONFIG_FILE`), as a route's keys; credentials in `--url`,
where the shell history and `ps` would show them, are refused."""

from __future__ import annotations

import time
from pathlib import Path

import bcrypt
import pytest

from certs import ca_server_client
from specwatch.cli import main as cli_main
from specwatch.export.http import serve
from specwatch.export.webconfig import parse_web_config
from specwatch.snapshot import RouteState, Snapshot

pytestmark = pytest.mark.slow  # loopback servers (guarded engines, the daemon's own server)

USER, PASSWORD = "operator", "st4tus-pass"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return ca_server_client(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def daemon(pki):
    """The daemon's own HTTP server, HTTPS with basic auth, serving one route."""
    web = parse_web_config(
        {
            "tls_server_config": {"cert_file": str(pki["server.pem"]), "key_file": str(pki["server.key"])},
            "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()},
        }
    )
    snap = Snapshot(timestamp=time.time(), routes=(RouteState(name="chat", up=True),))
    server = serve("127.0.0.1:0", lambda: snap, web)
    yield server.url
    server.shutdown()


def _http_config(tmp_path: Path, pki: dict[str, Path], password: str = PASSWORD) -> Path:
    secret = tmp_path / "password"
    secret.write_text(password + "\n")
    path = tmp_path / "http.yml"
    path.write_text(
        f"basic_auth: {{username: {USER}, password_file: {secret}}}\ntls_config: {{ca_file: {pki['ca.pem']}}}\n"
    )
    return path


def test_status_reaches_a_daemon_behind_tls_and_basic_auth_with_an_http_config_file(daemon, pki, tmp_path, capsys):
    assert cli_main(["status", "--url", daemon, "--http.config.file", str(_http_config(tmp_path, pki))]) == 0
    assert "chat" in capsys.readouterr().out


def test_the_http_config_file_may_come_from_the_environment(daemon, pki, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECWATCH_HTTP_CONFIG_FILE", str(_http_config(tmp_path, pki)))
    assert cli_main(["status", "--url", daemon]) == 0
    assert "chat" in capsys.readouterr().out


def test_a_wrong_password_or_none_is_a_clear_401(daemon, pki, tmp_path, capsys):
    wrong = _http_config(tmp_path, pki, password="not-it")
    assert cli_main(["status", "--url", daemon, "--http.config.file", str(wrong), "--timeout", "10"]) == 1
    assert "401 unauthorized" in capsys.readouterr().out
    trust_only = tmp_path / "trust.yml"
    trust_only.write_text(f"tls_config: {{ca_file: {pki['ca.pem']}}}\n")
    assert cli_main(["status", "--url", daemon, "--http.config.file", str(trust_only), "--timeout", "10"]) == 1
    assert "--http.config.file" in capsys.readouterr().out


def test_credentials_in_the_url_are_refused_and_never_echoed(daemon, capsys):
    url = daemon.replace("https://", f"https://{USER}:{PASSWORD}@")
    assert cli_main(["status", "--url", url]) == 2
    out, err = capsys.readouterr()
    assert "credentials in the URL are refused" in err and "--http.config.file" in err
    assert PASSWORD not in out + err


def test_a_bad_http_config_file_lists_its_problems(tmp_path, capsys):
    path = tmp_path / "http.yml"
    path.write_text("basic_auth: {password: x}\nbogus: 1\n")
    assert cli_main(["status", "--http.config.file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bogus: unknown key" in err and "basic_auth.username: required" in err


def test_plain_http_to_the_tls_port_says_to_use_https(daemon, capsys):
    plain = daemon.replace("https://", "http://")
    assert cli_main(["status", "--url", plain, "--timeout", "10"]) == 1
    assert f"this port serves TLS; use --url {daemon}" in " ".join(capsys.readouterr().out.split())
