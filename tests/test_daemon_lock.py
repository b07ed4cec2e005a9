"""One daemon per state directory (state/daemon_lock.py), and `specwatch run`'s refusal and warnings at start."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from specwatch.commands.run import Service
from specwatch.config import parse_config
from specwatch.state.daemon_lock import StateDirBusy, StateDirLock


def config_in(state_dir) -> object:
    return parse_config(
        {
            "state_dir": str(state_dir),
            "gpu": {"enabled": "false"},
            "routes": [{"name": "r", "url": "http://127.0.0.1:9/m"}],
        }
    )


def test_a_second_holder_is_refused_and_the_lock_is_free_once_released(tmp_path):
    first, second = StateDirLock(str(tmp_path)), StateDirLock(str(tmp_path))
    first.acquire()
    with pytest.raises(StateDirBusy, match="another `specwatch run` is using state_dir"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


@pytest.mark.slow
def test_a_holder_that_dies_leaves_no_stale_lock(tmp_path):
    holder = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from specwatch.state.daemon_lock import StateDirLock; StateDirLock({str(tmp_path)!r}).acquire()",
        ],
        timeout=60,
    )
    assert holder.returncode == 0
    lock = StateDirLock(str(tmp_path))
    lock.acquire()
    lock.release()


def test_run_refuses_to_start_on_a_state_dir_another_daemon_holds(tmp_path, caplog):
    held = StateDirLock(str(tmp_path))
    held.acquire()
    try:
        with caplog.at_level(logging.ERROR):
            assert Service(config_in(tmp_path), "", "127.0.0.1:0", None).run() == 1
        assert f"another `specwatch run` is using state_dir {tmp_path}" in caplog.text
    finally:
        held.release()


@pytest.mark.parametrize("address", ["0.0.0.0:9448", "[::]:9448", ":9448"])
def test_listening_on_all_addresses_without_tls_or_auth_is_a_warning(tmp_path, caplog, address):
    with caplog.at_level(logging.WARNING):
        Service(config_in(tmp_path), "", address, None)._warn_if_open_to_all()
    assert "listening on all addresses" in caplog.text and "without TLS or basic auth" in caplog.text


def test_loopback_without_tls_is_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        Service(config_in(tmp_path), "", "127.0.0.1:9448", None)._warn_if_open_to_all()
    assert caplog.text == ""
