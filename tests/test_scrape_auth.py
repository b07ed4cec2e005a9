"""Engine endpoints behind TLS client certificates, bearer tokens and basic auth, scraped as the daemon does
(config -> make_source -> sample) from real loopback servers; and the config checks that go with them."""

from __future__ import annotations

import base64
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from certs import ca_server_client
from specwatch.cli import main as cli_main
from specwatch.config import ConfigError, parse_config
from specwatch.sources.base import SourceError
from specwatch.sources.engines import make_source

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm" / "v1_k1_1engine.prom"
BODY = FIXTURE.read_bytes()
TOKEN = "s3cret-token"


class Handler(BaseHTTPRequestHandler):
    """Serves a captured vLLM /metrics to whoever presents what the server asks for; records the headers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.server.seen.append(dict(self.headers))
        wanted = self.server.authorization
        if wanted is not None and self.headers.get("Authorization") != wanted:
            self.reply(401, b"unauthorized\n")
        elif self.path.startswith("/elsewhere"):  # ?to=URL: a redirect to another origin
            self.reply(302, b"", location=self.path.split("?to=", 1)[1])
        elif self.path == "/metrics":
            self.reply(200, BODY)
        else:
            self.reply(404, b"not found\n")

    def reply(self, status: int, body: bytes, location: str = "") -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # refused TLS handshakes are what some tests are for


def start(tls: ssl.SSLContext | None = None, authorization: str | None = None) -> QuietServer:
    httpd = QuietServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.seen, httpd.authorization = [], authorization
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"{'https' if tls else 'http'}://127.0.0.1:{httpd.server_address[1]}"
    return httpd


def stop(httpd: QuietServer) -> None:
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and engine.test and a client certificate, made with openssl."""
    d = tmp_path_factory.mktemp("pki")
    ca_server_client(d)
    return d


@pytest.fixture(scope="module")
def mtls_server(pki):
    """HTTPS that refuses any client without a certificate signed by the test CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(pki / "ca.pem")
    httpd = start(tls=context)
    yield httpd
    stop(httpd)


@pytest.fixture(scope="module")
def bearer_server():
    httpd = start(authorization=f"Bearer {TOKEN}")
    yield httpd
    stop(httpd)


def config_for(route_yaml: str, scrape_yaml: str = "") -> object:
    import yaml

    raw = yaml.safe_load(f"scrape:\n  timeout: 2s\n{scrape_yaml}\nroutes:\n{route_yaml}")
    return parse_config(raw)


def sample(config, now: float = 1000.0):
    source = make_source(config.routes[0], config)
    try:
        return source.sample(now)
    finally:
        source.close()


# ---------------------------------------------------------------------------------------------- TLS
@pytest.mark.slow
def test_a_route_behind_tls_with_a_client_certificate_is_scraped(mtls_server, pki):
    config = config_for(f"""
  - name: chat
    url: {mtls_server.url}/metrics
    tls_config: {{ca_file: {pki}/ca.pem, cert_file: {pki}/client.pem, key_file: {pki}/client.key}}
""")
    result = sample(config)
    assert result.engine_kind.startswith("vllm")
    assert sum(e.accepted_tokens for e in result.engines) == 360  # the fixture's truth file


@pytest.mark.slow
def test_the_same_route_without_its_client_certificate_is_refused(mtls_server, pki):
    config = config_for(f"""
  - name: chat
    url: {mtls_server.url}/metrics
    tls_config: {{ca_file: {pki}/ca.pem}}
""")
    with pytest.raises(SourceError) as info:
        sample(config)
    assert info.value.reason == "connection"


@pytest.mark.slow
def test_the_tls_config_under_scrape_is_every_routes_default(mtls_server, pki):
    config = config_for(
        f"  - {{name: chat, url: '{mtls_server.url}/metrics'}}\n",
        f"  tls_config: {{ca_file: {pki}/ca.pem, cert_file: {pki}/client.pem, key_file: {pki}/client.key}}",
    )
    assert sample(config).engines


@pytest.mark.slow
def test_server_name_verifies_the_certificate_under_another_name(mtls_server, pki):
    tls = f"ca_file: {pki}/ca.pem, cert_file: {pki}/client.pem, key_file: {pki}/client.key"
    good = config_for(
        f"  - {{name: chat, url: '{mtls_server.url}/metrics', tls_config: {{{tls}, server_name: engine.test}}}}\n"
    )
    assert sample(good).engines
    wrong = config_for(
        f"  - {{name: chat, url: '{mtls_server.url}/metrics', tls_config: {{{tls}, server_name: other.test}}}}\n"
    )
    with pytest.raises(SourceError) as info:
        sample(wrong)
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)


@pytest.mark.slow
def test_insecure_skip_verify_accepts_a_certificate_no_ca_vouches_for(mtls_server, pki):
    client = f"cert_file: {pki}/client.pem, key_file: {pki}/client.key"
    verified = config_for(f"  - {{name: chat, url: '{mtls_server.url}/metrics', tls_config: {{{client}}}}}\n")
    with pytest.raises(SourceError, match="CERTIFICATE_VERIFY_FAILED"):
        sample(verified)
    skipped = config_for(
        f"  - {{name: chat, url: '{mtls_server.url}/metrics', tls_config: {{{client}, insecure_skip_verify: true}}}}\n"
    )
    assert sample(skipped).engines


# ---------------------------------------------------------------------------------------------- credentials
@pytest.mark.slow
def test_a_route_behind_a_bearer_token_is_scraped_with_the_token_from_its_file(bearer_server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # the trailing newline an editor leaves is not part of the token
    config = config_for(f"""
  - name: chat
    url: {bearer_server.url}/metrics
    authorization: {{type: Bearer, credentials_file: {token_file}}}
""")
    assert sample(config).engines
    assert bearer_server.seen[-1]["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.slow
def test_a_rotated_token_file_is_read_on_the_next_scrape_without_a_reload(bearer_server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("old-token")
    config = config_for(
        f"  - {{name: chat, url: '{bearer_server.url}/metrics', authorization: {{credentials_file: {token_file}}}}}\n"
    )
    source = make_source(config.routes[0], config)
    try:
        with pytest.raises(SourceError) as info:
            source.sample(1000.0)
        assert info.value.reason == "http_status" and "401" in str(info.value)
        token_file.write_text(TOKEN)
        assert source.sample(1005.0).engines
    finally:
        source.close()


@pytest.mark.slow
def test_inline_credentials_and_a_missing_token_file_at_scrape_time(bearer_server, tmp_path):
    inline = config_for(
        f"  - {{name: chat, url: '{bearer_server.url}/metrics', authorization: {{credentials: {TOKEN}}}}}\n"
    )
    assert sample(inline).engines
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    config = config_for(
        f"  - {{name: chat, url: '{bearer_server.url}/metrics', authorization: {{credentials_file: {token_file}}}}}\n"
    )
    token_file.unlink()  # gone after the config was checked
    with pytest.raises(SourceError) as info:
        sample(config)
    assert info.value.reason == "credentials" and str(token_file) in str(info.value)
    assert TOKEN not in str(info.value)


@pytest.mark.slow
def test_basic_auth_with_a_password_file(tmp_path):
    expected = "Basic " + base64.b64encode(b"scraper:pa55").decode()
    httpd = start(authorization=expected)
    try:
        (tmp_path / "pw").write_text("pa55\n")
        config = config_for(
            f"  - {{name: chat, url: '{httpd.url}/metrics', "
            f"basic_auth: {{username: scraper, password_file: {tmp_path}/pw}}}}\n"
        )
        assert sample(config).engines
    finally:
        stop(httpd)


@pytest.mark.slow
def test_headers_are_sent_and_the_token_never_follows_a_redirect_to_another_origin(bearer_server):
    other = start()
    try:
        config = config_for(
            f"  - {{name: chat, url: '{bearer_server.url}/elsewhere?to={other.url}/metrics', "
            f"authorization: {{credentials: {TOKEN}}}, headers: {{X-Scope-OrgID: team-a}}}}\n"
        )
        assert sample(config).engines
        assert bearer_server.seen[-1]["Authorization"] == f"Bearer {TOKEN}"
        assert other.seen[-1]["X-Scope-OrgID"] == "team-a"
        assert "Authorization" not in other.seen[-1]
    finally:
        stop(other)


# ---------------------------------------------------------------------------------------------- config
def test_credentials_in_a_url_are_rejected_by_check_config_with_the_path(tmp_path, capsys):
    path = tmp_path / "bad.yml"
    path.write_text(
        "routes:\n"
        "  - {name: a, url: 'http://127.0.0.1:8000/metrics'}\n"
        "  - {name: b, url: 'http://127.0.0.1:8001/metrics'}\n"
        "  - {name: c, url: 'http://scraper:hunter2@127.0.0.1:8002/metrics'}\n"
    )
    assert cli_main(["check-config", "--config.file", str(path)]) == 1
    err = capsys.readouterr().err
    assert "routes[2].url: credentials in the URL are not allowed" in err
    assert "hunter2" not in err


def test_every_http_client_problem_is_reported_at_once(tmp_path):
    raw = {
        "scrape": {
            "authorization": {"type": "Basic", "credentials": "x"},
            "headers": {"Authorization": "Bearer x", "X-Ok": "fine", "X-Bad": "a\r\nInjected: 1"},
        },
        "routes": [
            {
                "name": "a",
                "url": "http://h:1/metrics",
                "authorization": {"credentials": "x"},
                "basic_auth": {"username": "u", "password": "p"},
            },
            {
                "name": "b",
                "url": "https://h:1/metrics",
                "basic_auth": {"username": "u", "password": "p", "password_file": str(tmp_path / "nope")},
                "tls_config": {"cert_file": str(tmp_path / "nope.pem"), "insecure_skip_verify": "yes"},
            },
            {"name": "c", "url": "http://h:1/metrics", "authorization": {"type": "Bearer"}},
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    problems = info.value.problems
    for expected in (
        "scrape.authorization.type: Basic is set with basic_auth",
        "scrape.headers.Authorization: set by specwatch itself",
        "scrape.headers.X-Bad: the value must be ASCII text on one line",
        "routes[0]: give authorization or basic_auth, not both",
        "routes[1].basic_auth: give password or password_file, not both",
        "routes[1].tls_config: cert_file and key_file go together",
        "routes[1].tls_config.insecure_skip_verify: must be true or false",
        "routes[2].authorization: give credentials or credentials_file",
    ):
        assert any(p.startswith(expected) for p in problems), (expected, problems)
    assert len(problems) == 8


def test_check_config_warns_about_secret_files_it_cannot_read_without_failing(tmp_path, capsys):
    path = tmp_path / "ok.yml"
    path.write_text(
        f"routes:\n  - name: chat\n    url: https://127.0.0.1:8000/metrics\n"
        f"    authorization: {{credentials_file: {tmp_path}/token}}\n"
        f"    tls_config: {{ca_file: {tmp_path}/ca.pem}}\n"
    )
    assert cli_main(["check-config", "--config.file", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"WARNING: chat: authorization.credentials_file: cannot read {tmp_path}/token" in err
    assert f"WARNING: chat: tls_config.ca_file: cannot read {tmp_path}/ca.pem" in err


def test_check_config_warns_about_seed_from_files_it_cannot_read_as_about_a_routes(tmp_path, capsys):
    """`detection.seed_from` takes a route's HTTP client keys, so its files are checked the same way: every one
    listed at once, warnings that do not fail the config (the daemon loads it too, and learns instead); a route's
    own seed_from under the route, the inherited top-level one once."""
    (tmp_path / "ca.pem").write_text("present\n")
    path = tmp_path / "seed.yml"
    path.write_text(
        "detection:\n  seed_from:\n    prometheus: https://prometheus:9090\n"
        f"    basic_auth: {{username: u, password_file: {tmp_path}/pw}}\n"
        f"    tls_config: {{ca_file: {tmp_path}/ca.pem, cert_file: {tmp_path}/c.pem, key_file: {tmp_path}/k.pem}}\n"
        "routes:\n  - name: inherits\n    url: http://127.0.0.1:8000/metrics\n"
        "  - name: own\n    url: http://127.0.0.1:8001/metrics\n"
        "    detection:\n      seed_from:\n        prometheus: http://prometheus:9090\n"
        f"        authorization: {{credentials_file: {tmp_path}/token}}\n"
    )
    assert cli_main(["check-config", "--config.file", str(path), "--service.user", ""]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING:")]
    assert warnings == [
        f"WARNING: detection.seed_from: tls_config.cert_file: cannot read {tmp_path}/c.pem: No such file or directory",
        f"WARNING: detection.seed_from: tls_config.key_file: cannot read {tmp_path}/k.pem: No such file or directory",
        f"WARNING: detection.seed_from: basic_auth.password_file: cannot read {tmp_path}/pw: No such file or directory",
        f"WARNING: own: detection.seed_from: authorization.credentials_file: cannot read {tmp_path}/token: "
        "No such file or directory",
    ]


def test_a_routes_key_replaces_the_scrape_default_and_secrets_stay_out_of_repr():
    config = parse_config(
        {
            "scrape": {"authorization": {"credentials": "default-token"}, "headers": {"X-A": "1"}},
            "routes": [
                {"name": "a", "url": "http://h:1/metrics"},
                {"name": "b", "url": "http://h:1/metrics", "basic_auth": {"username": "u", "password": "route-pw"}},
            ],
        }
    )
    a, b = config.routes
    assert a.http.authorization.credentials == "default-token" and a.http.headers == (("X-A", "1"),)
    assert b.http.authorization is None and b.http.basic_auth.username == "u" and b.http.headers == (("X-A", "1"),)
    assert "default-token" not in repr(config) and "route-pw" not in repr(config)
