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
