"""Certificates for the TLS tests, made with the openssl CLI (skipped where it is missing)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def self_signed_for_localhost(directory: Path, common_name: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate valid for IP 127.0.0.1 (it is its own CA): (certificate, key)."""
    openssl(
        "req",
        "-x509",
        *EC_KEY,
        "-keyout",
        "key.pem",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={common_name}",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
        cwd=directory,
    )
    return directory / "cert.pem", directory / "key.pem"


def ca_server_client(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and engine.test signed by it and a client certificate signed by it:
    ca.pem, server.pem/.key, client.pem/.key."""
    openssl(
        "req",
        "-x509",
        *EC_KEY,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
        cwd=directory,
    )
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:engine.test\nextendedKeyUsage=serverAuth\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl(
            "req",
            "-new",
            *EC_KEY,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=directory,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=directory,
        )
    return {n: directory / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}
