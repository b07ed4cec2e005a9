"""`specwatch demo`: the packaged plan, the daemon config it generates, and (e2e) the whole story on a
real run: both routes up, the acceptance drop after the model bump, the ramped route above its crossover and
back below it (hysteresis), and a clean exit on Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from specwatch.config import parse_config
from specwatch.crossover.configured import LiveInputs, SweptCrossover
from specwatch.crossover.sweepfile import load_sweep
from specwatch.simulator.demo_plan import daemon_config, load_demo_plan, route_crossover, simulation_spec
from specwatch.simulator.launch import free_port
from specwatch.simulator.scenario import ScenarioError
from specwatch.simulator.speculation import parse_profile


def _specs(plan):
    return {r.name: simulation_spec(r, plan.time_scale) for r in plan.routes}


def test_packaged_plan_tells_the_story_within_two_minutes():
    plan = load_demo_plan()
    by_name = {r.name: r for r in plan.routes}
    assert (by_name["chat"].engine, by_name["chat"].dp) == ("vllm", 2)
    assert by_name["code"].engine == "sglang"
    specs = _specs(plan)
    real = lambda sim_seconds: sim_seconds / plan.time_scale  # noqa: E731

    bump = next(e for e in by_name["chat"].scenario.events if e.type == "model_bump")
    assert bump.params["acceptance_factor"] == pytest.approx(0.8)  # a ~20% acceptance drop
    assert 10 <= real(bump.at) <= 30  # "after a few minutes" of simulated time, early in a 120 s demo

    code = by_name["code"].scenario
    b_star = route_crossover(specs["code"])
    assert code.concurrency_at(0) / by_name["code"].dp < b_star  # starts below its crossover ...
    ramp_up, ramp_down = [e for e in code.events if e.type == "load"]
    up_end, down_end = ramp_up.at + ramp_up.params["over"], ramp_down.at + ramp_down.params["over"]
    assert code.concurrency_at(up_end) / by_name["code"].dp > 1.5 * b_star  # ... goes well above it ...
    assert code.concurrency_at(down_end) / by_name["code"].dp < 0.5 * b_star  # ... and back below the exit line
    assert real(up_end) <= 45 and real(down_end) <= 75  # leaves time for the hysteresis hold within 120 s


def test_generated_config_is_valid_and_uses_each_engines_own_crossover(tmp_path):
    plan = load_demo_plan()
    specs = _specs(plan)
    urls = {r.name: f"http://127.0.0.1:{9000 + i}/metrics" for i, r in enumerate(plan.routes)}
    config = parse_config(daemon_config(plan, urls, specs, str(tmp_path)), "demo")
    assert config.state_dir == str(tmp_path) and config.gpu.enabled == "false"
    code = config.route("code")
    assert code.url == urls["code"] and code.engine == "sglang"
    # k=4, alpha 0.7 on the H200 table: the sweep of the engines crosses in the reference's bracket
    swept = SweptCrossover(load_sweep(code.crossover.sweep_file)).answer(LiveInputs(positions=(), batch=None))
    assert code.crossover.kind == "sweep" and 64 < swept.batch_size < 96
    assert code.detection.min_duration_seconds <= 15
    chat_profile = parse_profile(specs["chat"].acceptance, specs["chat"].k)
    # pinned to what the simulated engine really starts with, so the drop is measured against the truth
    assert config.route("chat").baseline.acceptance_ratio == pytest.approx(chat_profile.acceptance_rate(), abs=1e-4)
    assert len(config.route("chat").baseline.position_acceptance) == specs["chat"].k


def test_a_broken_plan_is_reported_not_crashed():
    with pytest.raises(ScenarioError) as err:
        load_demo_plan(
            "time_scale: -1\nroutes:\n  - {name: x, engine: tgi}\n  - {name: y, engine: vllm, "
            "scenario: {events: [{at: 1m, type: nope}]}}\n"
        )
    text = str(err.value)
    assert "time_scale" in text and "routes[0].engine" in text and "events[0].type" in text


# ----------------------------------------------------------------------------------------- end to end
def _interactive_ctrl_c() -> None:
    """In the child: Ctrl-C as in a terminal. A test run started in the background by a non-interactive shell
    (nohup ... &) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _routes(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/routes", timeout=3) as resp:
        return {r["name"]: r for r in json.load(resp)["routes"]}


@pytest.mark.e2e
def test_demo_run_shows_the_drop_and_the_crossover_then_exits_cleanly_on_ctrl_c():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "demo", "--duration", "120", "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_interactive_ctrl_c,
    )
    seen = {
        "both_up": False,
        "first_model": None,
        "bumped": False,
        "degraded_after_bump": False,
        "above_crossover": False,
        "back_below_crossover": False,
    }
    deadline = time.monotonic() + 115
    try:
        while time.monotonic() < deadline and not all(seen.values()):
            time.sleep(1.0)
            try:
                routes = _routes(port)
            except OSError:
                continue
            chat, code = routes.get("chat"), routes.get("code")
            if not chat or not code:
                continue
            seen["both_up"] = seen["both_up"] or (chat["up"] and code["up"])
            if chat["up"] and chat.get("model_name"):
                seen["first_model"] = seen["first_model"] or chat["model_name"]
                seen["bumped"] = seen["bumped"] or chat["model_name"] != seen["first_model"]
            seen["degraded_after_bump"] = seen["degraded_after_bump"] or (seen["bumped"] and bool(chat["degraded"]))
            seen["back_below_crossover"] = seen["back_below_crossover"] or bool(
                seen["above_crossover"] and code["above_crossover"] is False
            )
            seen["above_crossover"] = seen["above_crossover"] or bool(
                code["above_crossover"] and code["batch_size"] > code["crossover_batch_size"]
            )
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert all(seen.values()), (seen, out[-3000:])
    assert proc.returncode == 0, out[-3000:]
    assert "SIMULATED" in out and "final state" in out


@pytest.mark.e2e
def test_ctrl_c_during_the_cleanup_does_not_leave_the_demo_hanging():
    """Ctrl-C pressed as --duration runs out lands in the cleanup; it must still finish and exit."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specwatch",
            "demo",
            "--duration",
            "6",
            "--web.listen-address",
            f"127.0.0.1:{free_port()}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_interactive_ctrl_c,
    )
    try:
        time.sleep(5.5)
        deadline = time.monotonic() + 25
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGINT)  # again and again, through the end of --duration and the cleanup
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    # 0, or killed by a Ctrl-C that came after main() returned (Python restores the default handler at exit)
    assert proc.returncode in (0, -signal.SIGINT), out[-2000:]
    assert "final state" in out  # the cleanup ran to its end
