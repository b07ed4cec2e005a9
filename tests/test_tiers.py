"""The unit tier's guard and the --fast option (tests/tiers.py), run on made-up test files by pytester in-process."""

from __future__ import annotations

import pytest

UNMARKED = """
import os
import socket
import subprocess
import sys
import threading


def test_binds():
    socket.socket().bind(("127.0.0.1", 0))


def test_listens_and_swallows_the_error():
    try:
        socket.socket().listen()
    except Exception:
        pass


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"])


def test_starts_a_process_on_another_thread():
    thread = threading.Thread(target=lambda: os.system("true"))
    thread.start()
    thread.join()


def test_computes():
    assert sum(range(10)) == 45
"""


@pytest.fixture
def guarded(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # hypothesis and the like: seconds per run
    pytester.makeconftest('pytest_plugins = ("tiers",)')
    return pytester


def test_an_unmarked_test_that_starts_a_process_or_binds_a_socket_fails_and_says_which_marker_it_needs(guarded):
    guarded.makepyfile(test_heavy=UNMARKED)
    result = guarded.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=4)
    for name, what in [
        ("test_binds", "bound a socket"),
        ("test_listens_and_swallows_the_error", "listened on a socket"),
        ("test_starts_a_process", "started a process"),
        ("test_starts_a_process_on_another_thread", "started a process (os.system)"),
    ]:
        result.stdout.fnmatch_lines([f"*test_heavy.py::{name} {what} but carries none of the markers*"])
    result.stdout.fnmatch_lines(["*mark it @pytest.mark.slow*"])


def test_a_fixture_that_starts_a_server_for_an_unmarked_test_fails_it(guarded):
    guarded.makepyfile(
        test_fixture="""
import socket
import pytest

@pytest.fixture
def server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock

def test_uses_the_server(server):
    pass
"""
    )
    result = guarded.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_fixture.py::test_uses_the_server bound a socket*"])


def test_fast_deselects_every_marked_test(guarded):
    guarded.makepyfile(
        test_marks="""
import pytest

def test_unit():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.e2e
def test_e2e():
    pass

@pytest.mark.real_engine
def test_engine():
    pass

@pytest.mark.gpu
def test_gpu():
    pass
"""
    )
    guarded.makeini("[pytest]\nmarkers =\n    slow\n    e2e\n    real_engine\n    gpu\n")
    guarded.runpytest_inprocess("-p", "no:cacheprovider", "--fast").assert_outcomes(passed=1, deselected=4)
    guarded.runpytest_inprocess("-p", "no:cacheprovider", "--fast", "-m", "slow").assert_outcomes(deselected=5)


@pytest.mark.slow  # the marked made-up test really binds a loopback socket and starts a process
def test_a_marked_test_may_start_a_process_and_bind_a_socket(guarded):
    marked = UNMARKED.replace("\ndef test_", "\n@pytest.mark.slow\ndef test_").replace(
        "import os", "import os\nimport pytest"
    )
    guarded.makepyfile(test_heavy=marked)
    guarded.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=5)


def test_a_library_that_probes_the_host_while_it_is_imported_does_not_fail_the_importing_test(guarded):
    # urllib3 binds a socket at import to learn whether IPv6 works: whichever test imports it first must pass.
    guarded.makepyfile(
        probes_at_import="""
import socket

with socket.socket() as _probe:
    _probe.bind(("127.0.0.1", 0))
""",
        test_imports_a_probing_library="""
def test_imports_it():
    import probes_at_import
""",
    )
    guarded.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
