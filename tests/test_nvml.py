"""The GPU source against the fake NVML's scenarios, and the /proc port -> process mapping on fake and real /proc."""

from __future__ import annotations

import logging
import math
import os
import socket
import sys

import pytest

from testbed import fake_nvml
from specwatch import catalog
from specwatch.config import GpuConfig, RouteConfig
from specwatch.sources import nvml as nvml_source
from specwatch.sources import procmap
from specwatch.sources.gpu_fields import GPM_FIELDS, NVML_FIELDS
from specwatch.sources.nvml import make_gpu_source

GPM_METRICS = {f.metric for f in GPM_FIELDS}
NVML_METRICS = {f.metric for f in NVML_FIELDS}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def source_for(nvml, enabled="true", **kwargs):
    return make_gpu_source(GpuConfig(enabled=enabled), nvml=nvml, **kwargs)


def two_cycles(src, t0=0.0):
    src.sample(t0)
    return src.sample(t0 + 5.0)


# --------------------------------------------------------------------------- field table <-> catalog <-> bindings
def test_every_field_row_has_a_catalog_entry_labelled_by_gpu_only():
    for metric in NVML_METRICS | GPM_METRICS:
        spec = catalog.BY_NAME[catalog.PREFIX + metric]
        assert spec.labels == ("gpu",) and spec.area == "gpu"
        assert spec.type == ("counter" if metric.endswith("_total") else "gauge"), metric
    for metric in GPM_METRICS:
        assert metric.endswith("_ratio")


def test_every_per_gpu_catalog_entry_is_collected():
    per_gpu = {m.name[len(catalog.PREFIX) :] for m in catalog.METRICS if m.labels == ("gpu",)}
    assert per_gpu - {"gpu_up"} == NVML_METRICS | GPM_METRICS


def test_field_table_names_exist_in_the_real_bindings_and_the_fake():
    import pynvml

    fake = fake_nvml.basic_h200(1)
    for module in (pynvml, fake):
        for row in NVML_FIELDS:
            assert callable(getattr(module, row.call)), row.call
            for arg in row.args:
                assert isinstance(getattr(module, arg), int), arg
        for row in GPM_FIELDS:
            assert isinstance(getattr(module, row.metric_id), int), row.metric_id


# --------------------------------------------------------------------------- scenarios
def test_disabled_means_no_source():
    assert make_gpu_source(GpuConfig(enabled="false"), nvml=fake_nvml.basic_h200()) is None


def test_basic_h200_converts_units_and_adds_gpm_from_the_second_cycle():
    nvml = fake_nvml.basic_h200(2)
    src = source_for(nvml)
    up, first = src.sample(0.0)
    assert up is True and [g.index for g in first] == [0, 1]
    assert not GPM_METRICS & set(first[0].fields), "GPM needs two samples; the first cycle has none"
    up, gpus = src.sample(5.0)
    g = gpus[0]
    assert g.up and g.uuid == "GPU-00000000-1111-2222-3333-444444444444" and g.name == "NVIDIA H200"
    assert g.driver == "580.159.04" and g.pids == (1000,)
    assert set(g.fields) == NVML_METRICS | GPM_METRICS
    f = g.fields
    assert f["gpu_power_watts"] == 412.0 and f["gpu_power_limit_watts"] == 700.0
    assert f["gpu_sm_clock_hertz"] == 1.98e9 and f["gpu_memory_clock_hertz"] == 3.201e9
    assert f["gpu_memory_used_bytes"] == 130_000_000_000  # v2: without the driver's reservation
    assert f["gpu_utilization_ratio"] == 1.0 and f["gpu_clock_throttle_reasons"] == 4
    assert f["gpu_tensor_active_ratio"] == pytest.approx(0.025)
    assert f["gpu_dram_bandwidth_utilization_ratio"] == pytest.approx(0.644)
    assert f["gpu_sm_active_ratio"] == pytest.approx(0.651) and f["gpu_sm_occupancy_ratio"] == pytest.approx(0.12)
    src.close()


def test_handles_and_gpm_buffers_are_obtained_once_and_freed_on_close():
    nvml = fake_nvml.basic_h200(2)
    src = source_for(nvml)
    for t in range(5):
        src.sample(t * 5.0)
    assert nvml.calls["nvmlInit"] == 1
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert nvml.calls["nvmlDeviceGetUUID"] == 2
    assert nvml.calls["nvmlGpmSampleAlloc"] == 4  # two per GPU
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 10  # used and total share one call per GPU per cycle
    assert nvml.calls["nvmlGpmMetricsGet"] == 8
    src.close()
    assert nvml.gpm_live == 0 and not nvml.initialized
    src.close()  # idempotent


def test_unsupported_and_forbidden_fields_are_absent_not_zero(caplog):
    nvml = fake_nvml.one_field_unsupported()
    src = source_for(nvml)
    with caplog.at_level(logging.DEBUG, logger="specwatch.sources.nvml"):
        _, gpus = two_cycles(src)
    fields = gpus[0].fields
    assert gpus[0].up
    for absent in (
        "gpu_power_watts",
        "gpu_ecc_corrected_errors_total",
        "gpu_ecc_uncorrected_errors_total",
        "gpu_dram_bandwidth_utilization_ratio",
    ):
        assert absent not in fields
    assert {"gpu_power_limit_watts", "gpu_tensor_active_ratio", "gpu_temperature_celsius"} <= set(fields)
    assert all(math.isfinite(v) for v in fields.values())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "NotSupported is normal, not a warning"


def test_an_unexpected_field_error_is_logged_once_until_the_field_recovers(caplog):
    nvml = fake_nvml.basic_h200(1)
    src = source_for(nvml)
    nvml.gpus[0].errors["nvmlDeviceGetTemperature"] = fake_nvml.NVML_ERROR_TIMEOUT
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.nvml"):
        for t in range(3):
            _, gpus = src.sample(t * 5.0)
            assert "gpu_temperature_celsius" not in gpus[0].fields and "gpu_power_watts" in gpus[0].fields
        assert len([r for r in caplog.records if "gpu_temperature_celsius" in r.getMessage()]) == 1
        del nvml.gpus[0].errors["nvmlDeviceGetTemperature"]
        assert src.sample(15.0)[1][0].fields["gpu_temperature_celsius"] == 52
        nvml.gpus[0].errors["nvmlDeviceGetTemperature"] = fake_nvml.NVML_ERROR_UNKNOWN
        src.sample(20.0)
    assert len([r for r in caplog.records if "gpu_temperature_celsius" in r.getMessage()]) == 2


def test_a_bug_in_one_call_costs_only_that_field():
    nvml = fake_nvml.basic_h200(1)
    nvml.nvmlDeviceGetPowerUsage = lambda handle: 1 / 0
    _, gpus = two_cycles(source_for(nvml))
    assert "gpu_power_watts" not in gpus[0].fields and "gpu_tensor_active_ratio" in gpus[0].fields


def test_bindings_without_a_function_disable_only_its_rows():
    nvml = fake_nvml.basic_h200(1)
    nvml.nvmlDeviceGetCurrentClocksEventReasons = None  # an older nvidia-ml-py
    _, gpus = two_cycles(source_for(nvml))
    assert "gpu_clock_throttle_reasons" not in gpus[0].fields and "gpu_power_watts" in gpus[0].fields


def test_lost_gpu_is_down_while_the_others_continue_and_comes_back(caplog):
    nvml = fake_nvml.gpu_lost_mid_run()
    src = source_for(nvml)
    src.sample(0.0)
    nvml.gpus[1].lost = True
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.nvml"):
        for t in (5.0, 10.0, 15.0):
            up, gpus = src.sample(t)
            assert up is True
            assert gpus[0].up and "gpu_tensor_active_ratio" in gpus[0].fields
            assert not gpus[1].up and gpus[1].fields == {} and gpus[1].pids == ()
            assert gpus[1].uuid == "GPU-00000001-1111-2222-3333-444444444444"  # still identifiable
    assert len([r for r in caplog.records if "GPU 1 lost" in r.getMessage()]) == 1
    nvml.gpus[1].lost = False
    _, gpus = src.sample(20.0)
    assert gpus[1].up and "gpu_power_watts" in gpus[1].fields
    assert "gpu_tensor_active_ratio" not in gpus[1].fields, "GPM must not span the outage"
    assert "gpu_tensor_active_ratio" in src.sample(25.0)[1][1].fields


@pytest.mark.parametrize("enabled, level", [("true", logging.WARNING), ("auto", logging.INFO)])
def test_library_missing_exports_down_logs_once_and_retries_every_minute(caplog, enabled, level):
    nvml = fake_nvml.library_missing()
    clock = Clock()
    src = source_for(nvml, enabled=enabled, clock=clock)
    with caplog.at_level(logging.INFO, logger="specwatch.sources.nvml"):
        for step in (0.0, 5.0, 25.0, 29.0):
            clock.now += step
            assert src.sample(0.0) == (False, ())
        assert nvml.calls["nvmlInit"] == 1
        clock.now += 1.0  # 60 s after the first try
        assert src.sample(0.0) == (False, ())
        assert nvml.calls["nvmlInit"] == 2
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(records) == 1 and records[0].levelno == level
    assert "nvml_up 0" in records[0].getMessage() and "Library Not Found" in records[0].getMessage()
    nvml.library_present = True  # the driver was installed meanwhile
    clock.now += 30.0
    assert src.sample(0.0) == (False, ())  # not before the next retry
    clock.now += 30.0
    up, gpus = src.sample(0.0)
    assert up is True and len(gpus) == 1


def test_retries_follow_the_monotonic_clock_not_the_wall_clock_passed_in():
    nvml = fake_nvml.library_missing()
    clock = Clock()
    src = source_for(nvml, clock=clock)
    src.sample(1_800_000_000.0)
    nvml.library_present = True
    clock.now += 60.0
    assert src.sample(1_700_000_000.0)[0] is True  # the wall clock stepped back; the retry still ran


def test_pynvml_not_installed(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    src = make_gpu_source(GpuConfig(enabled="true"))
    with caplog.at_level(logging.INFO, logger="specwatch.sources.nvml"):
        assert src.sample(0.0) == (False, ())
        assert src.sample(100.0) == (False, ())
    assert len(caplog.records) == 1 and "nvidia-ml-py" in caplog.records[0].getMessage()


def test_real_pynvml_on_a_host_without_a_driver_exports_nvml_down_and_no_gpu_samples():
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML loads on this machine")
    except pynvml.NVMLError:
        pass
    from specwatch.export import prometheus
    from prometheus_client import CollectorRegistry, generate_latest

    from specwatch.snapshot import Snapshot

    src = make_gpu_source(GpuConfig(enabled="true"))
    nvml_up, gpus = src.sample(0.0)
    snapshot = Snapshot(timestamp=0.0, gpus=gpus, nvml_up=nvml_up)
    registry = CollectorRegistry()
    registry.register(prometheus.SnapshotCollector(lambda: snapshot))
    text = generate_latest(registry).decode()
    assert "specwatch_nvml_up 0.0" in text
    assert not [line for line in text.splitlines() if line.startswith("specwatch_gpu_")]


def test_library_gone_mid_run_frees_buffers_and_reloads_later():
    nvml = fake_nvml.basic_h200(1)
    clock = Clock()
    src = source_for(nvml, clock=clock)
    two_cycles(src)
    nvml.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert src.sample(0.0) == (False, ())
    assert nvml.gpm_live == 0
    del nvml.gpus[0].errors["nvmlDeviceGetUtilizationRates"]
    clock.now += 30.0
    assert src.sample(0.0) == (False, ())  # waits for the retry
    clock.now += 30.0
    assert src.sample(0.0)[0] is True


def test_listing_gpus_failing_after_init_is_nvml_down_not_a_crash():
    nvml = fake_nvml.basic_h200(1)
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(fake_nvml.NVMLError(fake_nvml.NVML_ERROR_UNKNOWN))
    src = source_for(nvml)
    assert src.sample(0.0) == (False, ())
    assert not nvml.initialized  # shut down again, retried later


def test_pre_hopper_gpu_has_no_gpm_and_allocates_nothing():
    nvml = fake_nvml.pre_hopper()
    _, gpus = two_cycles(source_for(nvml))
    assert gpus[0].up and not GPM_METRICS & set(gpus[0].fields)
    assert {"gpu_power_watts", "gpu_memory_total_bytes"} <= set(gpus[0].fields)
    assert nvml.calls["nvmlGpmSampleAlloc"] == 0


def test_mig_mode_leaves_gpm_and_utilization_out():
    nvml = fake_nvml.mig_mode()
    _, gpus = two_cycles(source_for(nvml))
    assert gpus[0].up and not GPM_METRICS & set(gpus[0].fields)
    assert "gpu_utilization_ratio" not in gpus[0].fields and "gpu_memory_used_bytes" in gpus[0].fields
    assert nvml.calls["nvmlGpmSampleGet"] == 0


def test_gpm_values_are_clamped_to_ratios_and_non_finite_values_dropped():
    nvml = fake_nvml.basic_h200(1)
    nvml.gpus[0].gpm[fake_nvml.NVML_GPM_METRIC_SM_UTIL] = 100.4
    nvml.gpus[0].gpm[fake_nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL] = float("nan")
    _, gpus = two_cycles(source_for(nvml))
    assert gpus[0].fields["gpu_sm_active_ratio"] == 1.0
    assert "gpu_tensor_active_ratio" not in gpus[0].fields


def test_a_failed_gpm_sample_restarts_the_interval():
    nvml = fake_nvml.basic_h200(1)
    src = source_for(nvml)
    src.sample(0.0)
    nvml.gpus[0].errors["nvmlGpmSampleGet"] = fake_nvml.NVML_ERROR_UNKNOWN
    assert "gpu_sm_active_ratio" not in src.sample(5.0)[1][0].fields
    del nvml.gpus[0].errors["nvmlGpmSampleGet"]
    assert "gpu_sm_active_ratio" not in src.sample(10.0)[1][0].fields
    assert "gpu_sm_active_ratio" in src.sample(15.0)[1][0].fields


@pytest.mark.parametrize("scenario", sorted(fake_nvml.SCENARIOS))
def test_every_scenario_samples_without_raising_and_exports_only_finite_values(scenario):
    nvml = fake_nvml.SCENARIOS[scenario]()
    src = source_for(nvml)
    for t in range(4):
        if scenario == "gpu_lost_mid_run" and t == 2:
            nvml.gpus[1].lost = True
        up, gpus = src.sample(t * 5.0)
        assert isinstance(up, bool)
        for g in gpus:
            assert all(math.isfinite(v) and v >= 0 for v in g.fields.values())
            assert all(v <= 1 for k, v in g.fields.items() if k.endswith("_ratio"))
    src.close()
    assert nvml.gpm_live == 0


# --------------------------------------------------------------------------- /proc mapping
def _tcp_line(slot: int, local: str, state: str, inode: int) -> str:
    return (
        f"  {slot}: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000  1000        0 "
        f"{inode} 1 0000000000000000 100 0 0 10 0"
    )


_TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"


def fake_proc(tmp_path, *, tcp=(), tcp6=(), procs=()):
    """procs: (pid, ppid, comm, socket inodes)."""
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text("\n".join([_TCP_HEADER, *tcp]) + "\n")
    (root / "net" / "tcp6").write_text("\n".join([_TCP_HEADER, *tcp6]) + "\n")
    for pid, ppid, comm, inodes in procs:
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")
        os.symlink("/dev/null", root / str(pid) / "fd" / "0")
        for n, inode in enumerate(inodes, start=3):
            os.symlink(f"socket:[{inode}]", root / str(pid) / "fd" / str(n))
    return str(root)


def test_parse_listening_decodes_addresses_and_skips_other_states_and_ports():
    text = "\n".join(
        [
            _TCP_HEADER,
            _tcp_line(0, "0100007F:1F40", "0A", 555),  # 127.0.0.1:8000 LISTEN
            _tcp_line(1, "0100007F:1F40", "01", 556),  # established
            _tcp_line(2, "00000000:1F41", "0A", 557),  # another port
            "garbage line",
        ]
    )
    assert {i: str(a) for i, a in procmap.parse_listening(text, 8000).items()} == {555: "127.0.0.1"}
    six = "\n".join([_TCP_HEADER, _tcp_line(0, "00000000000000000000000001000000:1F40", "0A", 9)])
    assert str(procmap.parse_listening(six, 8000)[9]) == "::1"


def test_parent_pid_survives_odd_command_names(tmp_path):
    root = fake_proc(tmp_path, procs=[(42, 7, "a) (b c", ())])
    assert procmap.parent_pid(42, root) == 7
    assert procmap.parent_pid(43, root) is None


def test_listening_inodes_match_the_url_host(tmp_path):
    root = fake_proc(
        tmp_path,
        tcp=[_tcp_line(0, "0100007F:1F40", "0A", 1), _tcp_line(1, "00000000:1F41", "0A", 2)],
        tcp6=[_tcp_line(0, "00000000000000000000000000000000:1F40", "0A", 3)],
    )
    assert procmap.listening_inodes(8000, "127.0.0.1", root) == {1, 3}
    assert procmap.listening_inodes(8000, "localhost", root) == {1, 3}
    assert procmap.listening_inodes(8000, "10.1.2.3", root) == {3}  # only the wildcard serves another address
    assert procmap.listening_inodes(8001, "10.1.2.3", root) == {2}


def test_pids_serving_follows_ancestors_but_never_pid_1(tmp_path):
    root = fake_proc(
        tmp_path,
        procs=[
            (1, 0, "systemd", (777,)),  # socket activation holds another listener
            (100, 1, "vllm serve", (555,)),
            (101, 100, "EngineCore_DP0", ()),
            (102, 101, "worker", ()),
            (200, 1, "other", ()),
        ],
    )
    assert procmap.pids_serving({555}, [101, 102, 200], root) == {101, 102}
    assert procmap.pids_serving({777}, [101, 200], root) == set()
    assert procmap.pids_serving(set(), [101], root) == set()


@pytest.mark.slow
def test_is_local_host():
    assert procmap.is_local_host("localhost") and procmap.is_local_host("127.0.0.1")
    assert procmap.is_local_host("[::1]") and procmap.is_local_host(socket.gethostname())
    assert not procmap.is_local_host("192.0.2.1")  # TEST-NET-1, never assigned
    assert not procmap.is_local_host("inference.example.com")


@pytest.mark.slow
def test_real_proc_finds_this_process_listening():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        inodes = procmap.listening_inodes(port, "127.0.0.1")
        assert inodes
        assert procmap.pids_serving(inodes, [os.getpid()]) == {os.getpid()}


# --------------------------------------------------------------------------- route -> GPU mapping
def test_route_gpus_from_config_win_over_auto_mapping():
    src = source_for(fake_nvml.basic_h200(2))
    assert src.route_gpus(RouteConfig(name="r", url="http://127.0.0.1:8000/metrics", gpus=(1, 0))) == (1, 0)
    assert src.route_gpus(RouteConfig(name="r", url="http://127.0.0.1:8000/metrics", gpus=())) == ()


@pytest.mark.slow
def test_route_gpus_auto_maps_through_the_engine_process_tree_and_caches(tmp_path):
    nvml = fake_nvml.basic_h200(3)
    nvml.gpus[0].processes, nvml.gpus[1].processes, nvml.gpus[2].processes = (300,), (101,), (102,)
    root = fake_proc(
        tmp_path,
        tcp=[_tcp_line(0, "00000000:1F40", "0A", 555)],
        procs=[
            (100, 1, "vllm", (555,)),
            (101, 100, "EngineCore_DP0", ()),
            (102, 100, "EngineCore_DP1", ()),
            (300, 1, "someone else", ()),
        ],
    )
    clock = Clock()
    src = source_for(nvml, clock=clock, proc_root=root)
    route = RouteConfig(name="r", url="http://localhost:8000/metrics")
    assert src.route_gpus(route) == ()  # nothing sampled yet: no GPU processes known
    src.sample(0.0)
    assert src.route_gpus(route) == ()  # cached for the retry period
    clock.now += nvml_source.ROUTE_MAP_RETRY_SECONDS
    assert src.route_gpus(route) == (1, 2)
    nvml.gpus[0].processes = (101,)
    src.sample(5.0)
    assert src.route_gpus(route) == (1, 2)  # cached
    clock.now += nvml_source.ROUTE_MAP_REFRESH_SECONDS
    assert src.route_gpus(route) == (0, 1, 2)
    remote = RouteConfig(name="far", url="http://192.0.2.1:8000/metrics")
    assert src.route_gpus(remote) == ()


def test_route_mapping_failure_is_empty_not_an_exception_and_logged_once(tmp_path, monkeypatch, caplog):
    clock = Clock()
    src = source_for(fake_nvml.basic_h200(1), proc_root=str(tmp_path), clock=clock)
    src.sample(0.0)
    monkeypatch.setattr(procmap, "listening_inodes", lambda *a: 1 / 0)
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.nvml"):
        for _ in range(3):
            assert src.route_gpus(RouteConfig(name="r", url="http://127.0.0.1:8000/")) == ()
            clock.now += nvml_source.ROUTE_MAP_RETRY_SECONDS
    assert len(caplog.records) == 1 and "set gpus:" in caplog.records[0].getMessage()


def test_a_gpu_lost_before_start_is_down_and_opened_when_it_answers():
    nvml = fake_nvml.gpu_lost_mid_run()
    nvml.gpus[1].lost = True
    src = source_for(nvml)
    up, gpus = src.sample(0.0)
    assert up is True and gpus[0].up and not gpus[1].up
    nvml.gpus[1].lost = False
    _, gpus = src.sample(5.0)
    assert gpus[1].up and gpus[1].uuid.startswith("GPU-00000001") and "gpu_power_watts" in gpus[1].fields
    assert "gpu_tensor_active_ratio" in src.sample(10.0)[1][1].fields
    src.close()
    assert nvml.gpm_live == 0


def test_localhost_is_served_by_loopback_and_wildcard_listeners_only(tmp_path):
    root = fake_proc(
        tmp_path,
        tcp=[
            _tcp_line(0, "0100007F:1F40", "0A", 1),
            _tcp_line(1, "0302010A:1F40", "0A", 2),
            _tcp_line(2, "00000000:1F40", "0A", 3),
        ],
    )
    assert procmap.listening_inodes(8000, "localhost", root) == {1, 3}
    assert procmap.listening_inodes(8000, "10.1.2.3", root) == {2, 3}
