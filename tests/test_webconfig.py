"""--web.config.file: strict parsing, TLS (server and client certificates, minimum version), bcrypt basic auth.

Certificates are made here with the openssl CLI; a bcrypt hash of cost 4 keeps the suite fast. TLS is checked
against a real loopback HTTPS server using the WebConfig exactly as the daemon's HTTP server does.
"""

from __future__ import annotations

import base64
import logging
import os
import http.server
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import bcrypt
import pytest
import requests

from specwatch import secret_files
from specwatch.config import ConfigError
from specwatch.export import webconfig
from specwatch.export.webconfig import load_web_config, parse_basic_authorization, parse_web_config

PASSWORD = "s3cret-scrape"
USER_HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all EC P-256, via openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = directory

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=specwatch test CA")
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# --------------------------------------------------------------------------- parsing
def test_empty_file_means_plain_http_without_auth(tmp_path):
    cfg = load_web_config(write(tmp_path, ""))
    assert cfg.ssl_context() is None
    assert cfg.authorize({}) is True
    assert not cfg.auth_required


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(
        tmp_path,
        """
tls_server_config:
  cert_file: a.crt
  min_version: TLS10
  client_auth_type: RequireAnyClientCert
  bogus: 1
basic_auth_users:
  alice: plaintext-password
extra: true
""",
    )
    with pytest.raises(ConfigError) as err:
        load_web_config(path)
    text = "\n".join(err.value.problems)
    assert "extra: unknown key" in text
    assert "tls_server_config.bogus: unknown key" in text
    assert "tls_server_config.key_file: required" in text
    assert "TLS10 is insecure" in text
    assert "RequireAnyClientCert" in text and "not supported" in text
    assert "basic_auth_users.alice: not a bcrypt hash" in text
    assert "tls_server_config.cert_file: " in text and "a.crt: No such file or directory" in text
    assert "plaintext-password" not in str(err.value)  # a pasted password is never echoed into logs
    assert len(err.value.problems) == 7


@pytest.mark.slow
def test_client_ca_and_client_auth_type_must_agree(tmp_path, pki):
    with pytest.raises(ConfigError, match="client_ca_file: required"):
        parse_web_config(
            {
                "tls_server_config": {
                    "cert_file": str(pki["server.crt"]),
                    "key_file": str(pki["server.key"]),
                    "client_auth_type": "RequireAndVerifyClientCert",
                }
            }
        )
    with pytest.raises(ConfigError, match="client_auth_type is NoClientCert"):
        parse_web_config(
            {
                "tls_server_config": {
                    "cert_file": str(pki["server.crt"]),
                    "key_file": str(pki["server.key"]),
                    "client_ca_file": str(pki["ca.crt"]),
                }
            }
        )


@pytest.mark.slow
def test_unloadable_certificate_is_a_config_error(tmp_path, pki):
    (tmp_path / "garbage.crt").write_text("not a certificate")
    with pytest.raises(ConfigError, match="cannot load certificate"):
        load_web_config(
            write(tmp_path, f"tls_server_config: {{cert_file: garbage.crt, key_file: {pki['server.key']}}}")
        )
    with pytest.raises(ConfigError, match="missing.crt: No such file or directory"):
        load_web_config(write(tmp_path, "tls_server_config: {cert_file: missing.crt, key_file: missing.key}"))


@pytest.mark.slow
def test_relative_paths_resolve_against_the_web_config_directory(tmp_path, pki):
    for name in ("server.crt", "server.key"):
        shutil.copy(pki[name], tmp_path / name)
    cfg = load_web_config(write(tmp_path, "tls_server_config: {cert_file: server.crt, key_file: server.key}"))
    assert cfg.tls.cert_file == str(tmp_path / "server.crt")
    assert cfg.ssl_context().minimum_version == ssl.TLSVersion.TLSv1_2


def test_unreadable_and_invalid_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_web_config(tmp_path / "absent.yml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_web_config(write(tmp_path, "tls_server_config: [unclosed"))


@pytest.mark.slow
def test_exporter_toolkit_only_keys_are_accepted(tmp_path, pki):
    cfg = parse_web_config(
        {
            "tls_server_config": {
                "cert_file": str(pki["server.crt"]),
                "key_file": str(pki["server.key"]),
                "cipher_suites": ["TLS_AES_128_GCM_SHA256"],
                "min_version": "TLS13",
            },
            "http_server_config": {"http2": True},
        }
    )
    assert cfg.ssl_context().minimum_version == ssl.TLSVersion.TLSv1_3


# --------------------------------------------------------------------------- basic auth
@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("", None),
        ("Bearer abc", None),
        ("Basic !!!", None),
        ("Basic " + base64.b64encode(b"no-colon").decode(), None),
        ("basic " + base64.b64encode(b"u:p:with:colons").decode(), ("u", "p:with:colons")),
    ],
)
def test_parse_basic_authorization(value, expected):
    assert parse_basic_authorization(value) == expected


def test_basic_auth_accepts_only_the_right_password():
    cfg = parse_web_config({"basic_auth_users": {"prometheus": USER_HASH}})
    assert cfg.auth_required
    assert cfg.authorize(basic("prometheus", PASSWORD))
    assert not cfg.authorize(basic("prometheus", PASSWORD + "x"))
    assert not cfg.authorize(basic("mallory", PASSWORD))
    assert not cfg.authorize({})


def test_unknown_user_costs_a_bcrypt_of_the_configured_cost(monkeypatch):
    """Timing must not reveal which users exist: an unknown user runs bcrypt against a dummy of the same cost."""
    slow_hash = bcrypt.hashpw(b"pw", bcrypt.gensalt(6)).decode()
    cfg = parse_web_config({"basic_auth_users": {"prometheus": slow_hash}})
    checked: list[bytes] = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: checked.append(h) or real(pw, h))
    assert not cfg.authorize(basic("nobody", "pw"))
    assert not cfg.authorize(basic("prometheus", "wrong"))
    assert len(checked) == 2
    assert checked[0] != slow_hash.encode() and checked[0][:7] == b"$2b$06$"  # dummy, same cost
    assert checked[1] == slow_hash.encode()


def test_outcomes_are_cached_under_an_hmac_and_a_repeated_wrong_password_costs_one_bcrypt(monkeypatch):
    now = [1000.0]
    auth = webconfig._BasicAuth({"prometheus": USER_HASH}, clock=lambda: now[0])
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(1) or real(pw, h))
    assert auth.check("prometheus", PASSWORD) and auth.check("prometheus", PASSWORD)
    assert len(calls) == 1
    assert not auth.check("prometheus", "wrong") and not auth.check("prometheus", "wrong")
    assert len(calls) == 2
    assert auth.cached("prometheus", PASSWORD) is True and auth.cached("prometheus", "wrong") is False
    assert auth.cached("prometheus", "never tried") is None
    now[0] += webconfig.AUTH_CACHE_SECONDS + 1
    assert auth.check("prometheus", PASSWORD) and not auth.check("prometheus", "wrong")
    assert len(calls) == 4
    for key in (*auth._passed, *auth._failed):  # keyed by HMAC, never the password
        assert PASSWORD.encode() not in key and b"wrong" not in key


def test_the_failure_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: False)
    auth = webconfig._BasicAuth({"prometheus": USER_HASH})
    for i in range(webconfig.AUTH_CACHE_MAX_ENTRIES * 3):
        assert not auth.check("prometheus", f"guess {i}")
    assert len(auth._failed) <= webconfig.AUTH_CACHE_MAX_ENTRIES


def test_a_cached_right_password_is_not_held_up_by_wrong_ones_being_checked(monkeypatch):
    """48 clients with wrong passwords once made a right one wait 14 s: the cache was read under bcrypt's lock."""
    cfg = parse_web_config({"basic_auth_users": {"prometheus": USER_HASH}})
    assert cfg.authorize(basic("prometheus", PASSWORD))  # now cached
    inside, gate = threading.Event(), threading.Event()
    real = bcrypt.checkpw

    def slow_checkpw(password: bytes, hashed: bytes) -> bool:
        inside.set()
        gate.wait(30)  # a wrong password's bcrypt, held until the test lets it go
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", slow_checkpw)
    wrong = [
        threading.Thread(target=cfg.authorize, args=(basic("prometheus", f"wrong {i}"),), daemon=True) for i in range(8)
    ]
    answered = threading.Event()
    right = threading.Thread(
        target=lambda: cfg.authorize(basic("prometheus", PASSWORD)) and answered.set(), daemon=True
    )
    try:
        for t in wrong:
            t.start()
        assert inside.wait(10)
        right.start()
        assert answered.wait(10), "a cached right password waited for wrong passwords' bcrypt checks"
        assert cfg.authorize_cached(basic("prometheus", PASSWORD)) is True
        assert cfg.authorize_cached(basic("prometheus", "not yet checked")) is None
    finally:
        gate.set()
        for t in (*wrong, right):
            t.join(10) if t.ident else None


# --------------------------------------------------------------------------- a real HTTPS server
class _Handler(http.server.BaseHTTPRequestHandler):
    web: webconfig.WebConfig

    def do_GET(self):
        if not self.web.authorize(self.headers):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="specwatch"')
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(cfg: webconfig.WebConfig) -> str:
        handler = type("H", (_Handler,), {"web": cfg})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        ctx = cfg.ssl_context()
        if ctx is not None:
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"{'https' if ctx else 'http'}://127.0.0.1:{server.server_address[1]}/metrics"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.mark.slow
def test_tls_with_basic_auth_answers_401_then_200(tmp_path, pki, serve):
    cfg = load_web_config(
        write(
            tmp_path,
            f"""
tls_server_config: {{cert_file: {pki["server.crt"]}, key_file: {pki["server.key"]}}}
basic_auth_users: {{prometheus: '{USER_HASH}'}}
""",
        )
    )
    url = serve(cfg)
    anonymous = requests.get(url, verify=str(pki["ca.crt"]), timeout=5)
    assert anonymous.status_code == 401 and anonymous.content == b""
    assert requests.get(url, verify=str(pki["ca.crt"]), auth=("prometheus", PASSWORD), timeout=5).status_code == 200
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, verify=True, timeout=5)  # not a public CA: plain clients must not be fooled either


@pytest.mark.slow
def test_minimum_tls_version_is_enforced(tmp_path, pki, serve):
    cfg = parse_web_config(
        {
            "tls_server_config": {
                "cert_file": str(pki["server.crt"]),
                "key_file": str(pki["server.key"]),
                "min_version": "TLS13",
            }
        }
    )
    url = serve(cfg)
    client = ssl.create_default_context(cafile=str(pki["ca.crt"]))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError):
            client.wrap_socket(raw, server_hostname="127.0.0.1").close()


@pytest.mark.slow
def test_client_certificates_are_required_and_verified(pki, serve):
    cfg = parse_web_config(
        {
            "tls_server_config": {
                "cert_file": str(pki["server.crt"]),
                "key_file": str(pki["server.key"]),
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": str(pki["ca.crt"]),
            }
        }
    )
    url = serve(cfg)
    ok = requests.get(url, verify=str(pki["ca.crt"]), cert=(str(pki["client.crt"]), str(pki["client.key"])), timeout=5)
    assert ok.status_code == 200
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        requests.get(url, verify=str(pki["ca.crt"]), timeout=5)


@pytest.mark.slow
def test_rotated_certificate_is_picked_up_without_restart(tmp_path, pki, serve):
    for name in ("server.crt", "server.key"):
        shutil.copy(pki[name], tmp_path / name)
    cfg = load_web_config(write(tmp_path, "tls_server_config: {cert_file: server.crt, key_file: server.key}"))
    url = serve(cfg)
    assert requests.get(url, verify=str(pki["ca.crt"]), timeout=5).status_code == 200

    (tmp_path / "rotated").mkdir()
    fresh = make_pki(tmp_path / "rotated")
    time.sleep(0.01)  # distinct mtime_ns even on coarse-timestamp filesystems
    shutil.copy(fresh["server.key"], tmp_path / "server.key")
    shutil.copy(fresh["server.crt"], tmp_path / "server.crt")
    assert requests.get(url, verify=str(fresh["ca.crt"]), timeout=5).status_code == 200
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, verify=str(pki["ca.crt"]), timeout=5)

    (tmp_path / "server.crt").write_text("broken rotation")  # a bad rotation keeps the last good certificate
    assert requests.get(url, verify=str(fresh["ca.crt"]), timeout=5).status_code == 200


@pytest.mark.slow
def test_the_daemons_own_server_guards_the_advice_api_with_tls_and_basic_auth(tmp_path, pki):
    from specwatch.export.http import serve as serve_daemon
    from specwatch.snapshot import RouteState, Snapshot

    cfg = load_web_config(
        write(
            tmp_path,
            f"""
tls_server_config: {{cert_file: {pki["server.crt"]}, key_file: {pki["server.key"]}}}
basic_auth_users: {{prometheus: '{USER_HASH}'}}
""",
        )
    )
    snapshot = Snapshot(timestamp=time.time(), routes=(RouteState(name="chat", up=True, above_crossover=True),))
    server = serve_daemon("127.0.0.1:0", lambda: snapshot, cfg)
    try:
        url = server.url + "/api/v1/advice"
        assert url.startswith("https://")
        anonymous = requests.get(url, verify=str(pki["ca.crt"]), timeout=10)
        assert anonymous.status_code == 401 and b"chat" not in anonymous.content
        wrong = requests.get(url, verify=str(pki["ca.crt"]), auth=("prometheus", "wrong"), timeout=10)
        assert wrong.status_code == 401
        answer = requests.get(url, verify=str(pki["ca.crt"]), auth=("prometheus", PASSWORD), timeout=10)
        assert answer.status_code == 200 and answer.json()["routes"][0]["speculate"] is False
    finally:
        server.shutdown()


@pytest.mark.slow
def test_the_daemons_own_server_picks_up_rotated_certificates_and_requires_client_certificates(tmp_path, pki):
    """uvicorn serves the web config's own SSLContext (not one built from file names), so its handshake callback
    still reloads rotated files, and client certificates are still required and verified."""
    from specwatch.export.http import serve as serve_daemon
    from specwatch.snapshot import Snapshot

    for name in ("server.crt", "server.key"):
        shutil.copy(pki[name], tmp_path / name)
    cfg = load_web_config(
        write(
            tmp_path,
            f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki["ca.crt"]}
""",
        )
    )
    server = serve_daemon("127.0.0.1:0", lambda: Snapshot(timestamp=1.0), cfg)
    client = (str(pki["client.crt"]), str(pki["client.key"]))
    url = server.url + "/-/healthy"
    try:
        assert requests.get(url, verify=str(pki["ca.crt"]), cert=client, timeout=10).status_code == 200
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, verify=str(pki["ca.crt"]), timeout=10)
        (tmp_path / "rotated").mkdir()
        fresh = make_pki(tmp_path / "rotated")
        time.sleep(0.01)  # distinct mtime_ns even on coarse-timestamp filesystems
        shutil.copy(fresh["server.key"], tmp_path / "server.key")
        shutil.copy(fresh["server.crt"], tmp_path / "server.crt")
        assert requests.get(url, verify=str(fresh["ca.crt"]), cert=client, timeout=10).status_code == 200
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(url, verify=str(pki["ca.crt"]), cert=client, timeout=10)
    finally:
        server.shutdown()


def test_a_missing_or_odd_tls_file_is_named_each_in_its_own_problem(tmp_path):
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    raw = {"tls_server_config": {"cert_file": str(tmp_path / "nope.pem"), "key_file": str(fifo)}}
    with pytest.raises(ConfigError) as caught:
        parse_web_config(raw, str(tmp_path / "web.yml"))
    problems = caught.value.problems
    assert f"tls_server_config.cert_file: cannot read {tmp_path / 'nope.pem'}: No such file or directory" in problems
    assert f"tls_server_config.key_file: {fifo} is a FIFO, not a regular file: refused" in problems


@pytest.mark.slow
def test_an_oversized_tls_file_is_refused_at_load_and_a_readable_key_warned_about(tmp_path, pki, caplog):
    big = tmp_path / "bundle.pem"
    big.write_bytes(pki["ca.crt"].read_bytes() * (secret_files.MAX_TLS_FILE_BYTES // 500))
    size = big.stat().st_size
    raw = {"tls_server_config": {"cert_file": str(big), "key_file": str(pki["server.key"])}}
    with pytest.raises(ConfigError) as caught:
        parse_web_config(raw)
    assert caught.value.problems == [
        f"tls_server_config.cert_file: {big} is {size} bytes, over the "
        f"{secret_files.MAX_TLS_FILE_BYTES}-byte cap for this file: refused"
    ]
    key = tmp_path / "server.key"
    shutil.copy(pki["server.key"], key)
    key.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="specwatch.export.webconfig"):
        parse_web_config({"tls_server_config": {"cert_file": str(pki["server.crt"]), "key_file": str(key)}})
    assert f"web config: TLS key file {key} is world-readable (mode 0644): chmod o-r it" in caplog.messages


@pytest.mark.slow
@pytest.mark.parametrize("swap", ["fifo", "oversized"])
def test_a_rotated_key_that_is_a_fifo_or_oversized_is_refused_and_the_previous_one_serves(tmp_path, pki, caplog, swap):
    """On the daemon's own server the check runs at the handshake, before `ssl` opens anything: a FIFO would
    block that open on the event loop (every connection with it); an oversized file is refused unread. The last
    good certificate keeps serving, and a good key is picked up again."""
    from specwatch.export.http import serve as serve_daemon
    from specwatch.snapshot import Snapshot

    for name in ("server.crt", "server.key"):
        shutil.copy(pki[name], tmp_path / name)
    cfg = load_web_config(write(tmp_path, "tls_server_config: {cert_file: server.crt, key_file: server.key}"))
    server = serve_daemon("127.0.0.1:0", lambda: Snapshot(timestamp=1.0), cfg)
    url, ca = server.url + "/-/healthy", str(pki["ca.crt"])
    key = tmp_path / "server.key"
    try:
        assert requests.get(url, verify=ca, timeout=10).status_code == 200
        key.unlink()
        cap = secret_files.MAX_TLS_FILE_BYTES
        if swap == "fifo":
            os.mkfifo(key)
            expected = f"{key} is a FIFO, not a regular file: refused"
        else:
            key.write_bytes(b"A" * (cap + 1))
            expected = f"{key} is {cap + 1} bytes, over the {cap}-byte cap for this file: refused"
        with caplog.at_level(logging.INFO, logger="specwatch.export.webconfig"):
            for _ in range(2):
                assert requests.get(url, verify=ca, timeout=10).status_code == 200
        assert [r.getMessage() for r in caplog.records if r.name == "specwatch.export.webconfig"] == [
            f"web config: rotated TLS files refused, keeping the previous ones: {expected}"
        ]
        key.unlink()
        shutil.copy(pki["server.key"], key)
        assert requests.get(url, verify=ca, timeout=10).status_code == 200
    finally:
        if key.is_fifo():  # a server blocked opening the FIFO is freed by a writer that comes and goes
            try:
                os.close(os.open(key, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # no reader: nothing is blocked
        server.shutdown()
