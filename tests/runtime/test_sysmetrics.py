"""System metrics: a real process tree sampled from /proc, NVML's absence, and a real run
on Ray emitting one ``sys_metrics`` event per unit at about the configured rate."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import pytest

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import ListSink, SysMetrics, event_from_json
from gyre_core.runtime import run_job
from gyre_core.runtime.session import make_model_dir
from gyre_core.runtime.sysmetrics import ProcessSampler, combine, gpu_stats, process_tree
from tests.runtime.conftest import tiny_job

BUSY_CHILD = """
import subprocess, sys
if sys.argv[1:] == ["child"]:
    held = bytearray(80 * 2**20)  # resident: written on allocation
    while True:
        pass
subprocess.Popen([sys.executable, __file__, "child"]).wait()
"""


def test_a_process_tree_is_sampled_with_its_children(tmp_path: Path) -> None:
    script = tmp_path / "tree.py"
    script.write_text(BUSY_CHILD)
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 20
        while len(process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sampler = ProcessSampler(parent.pid)
        time.sleep(1.5)
        s = sampler.sample()
        assert s["procs"] == 2  # the parent and its busy child
        assert 20.0 < s["cpu_pct"] < 100.0 * (os.cpu_count() or 1) + 5  # about one core
        assert s["rss_mb"] > 80.0  # the child's 80 MiB, and two interpreters
        assert 0 < s["host_mem_used_mb"] < s["host_mem_total_mb"]
        assert s["gpu"] == gpu_stats([])  # no GPUs asked for: no GPU fields
    finally:
        for pid in process_tree(parent.pid):
            if pid != parent.pid:
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_a_gone_process_samples_as_empty() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    s = ProcessSampler(dead.pid).sample()
    assert (s["procs"], s["cpu_pct"], s["rss_mb"]) == (0, 0.0, 0.0)


def test_without_nvml_the_gpu_fields_are_omitted(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails, as where absent
    assert gpu_stats([0, 1]) == {}  # asked for GPUs, no pynvml: nothing, no error
    e = combine(3, "n1", [ProcessSampler().sample([0])], t=1.0)
    assert e.gpu == {} and e.unit == 3 and e.procs >= 1 and e.rss_mb > 0
    assert event_from_json(e.to_json()) == e


class _StandInNvml:
    """pynvml's calls that gpu_stats makes, answering as a driver with two GPUs would (this
    machine has none; a run on GPUs uses the real module)."""

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=[20, 60][h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * 1024 * 2**20, total=80 * 1024 * 2**20, free=0)


def test_nvml_values_are_read_and_a_failing_driver_gives_none(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _StandInNvml())
    assert gpu_stats([0, 1]) == {
        "util_pct": 40.0, "mem_mb": 3072.0, "mem_total_mb": 163840.0, "count": 2.0
    }  # fmt: skip
    assert ProcessSampler().sample([1])["gpu"]["util_pct"] == 60.0
    monkeypatch.setitem(sys.modules, "pynvml", _StandInNvml(fail_init=True))
    assert gpu_stats([0]) == {}


def test_combine_sums_processes_and_weighs_gpu_utilisation_by_gpu() -> None:
    gpu = {"util_pct": 90.0, "mem_mb": 1000.0, "mem_total_mb": 8000.0, "count": 1.0}
    two = {"util_pct": 30.0, "mem_mb": 3000.0, "mem_total_mb": 16000.0, "count": 2.0}
    host = {"host_mem_used_mb": 5.0, "host_mem_total_mb": 9.0}
    a = {"procs": 2, "cpu_pct": 50.0, "rss_mb": 100.0, "gpu": gpu, **host}
    b = {"procs": 1, "cpu_pct": 25.0, "rss_mb": 50.0, "gpu": two, **host}
    e = combine(0, "", [a, b], t=2.0)
    assert (e.procs, e.cpu_pct, e.rss_mb) == (3, 75.0, 150.0)
    assert e.gpu == {"util_pct": 50.0, "mem_mb": 4000.0, "mem_total_mb": 24000.0, "count": 3.0}


def test_the_rate_is_validated() -> None:
    for bad in (-1, 1e9):
        with pytest.raises(ConfigError, match=r"cluster\.sysmetrics_s"):
            RunConfig.from_dict({"cluster": {"sysmetrics_s": bad}})
    assert RunConfig.from_dict({}).cluster.sysmetrics_s == 0.0


@pytest.mark.slow
def test_a_real_run_emits_each_units_metrics_at_the_configured_rate(ray_cluster, tmp_path):
    job = tiny_job()
    job["cluster"]["sysmetrics_s"] = 0.5
    model = make_model_dir(RunConfig.from_dict(job), tmp_path / "m")
    cfg = RunConfig.from_dict({**job, "model": {"checkpoint": str(model)}})
    sink = ListSink()
    out = run_job(cfg, sink=sink, workdir=tmp_path / "run")
    assert out["status"] == "succeeded"
    metrics = sink.of(SysMetrics)
    statuses = [i for i, e in enumerate(sink.events) if e.kind == "run_status"]
    assert max(i for i, e in enumerate(sink.events) if e.kind == "sys_metrics") < statuses[-1]
    end = [e.t for e in sink.events if e.kind == "run_status"][-1]
    for unit in range(cfg.cluster.units):
        mine = [e for e in metrics if e.unit == unit]
        gaps = [b.t - a.t for a, b in itertools.pairwise(mine)]
        span = end - mine[0].t  # from its first sample (the units start after the model)
        print(f"unit {unit}: {len(mine)} samples over {span:.1f} s, median gap "
              f"{median(gaps):.2f} s, cpu max {max(e.cpu_pct for e in mine):.0f} %, "
              f"rss max {max(e.rss_mb for e in mine):.0f} MB")  # fmt: skip
        assert len(mine) >= 0.6 * span / 0.5 and 0.45 <= median(gaps) <= 1.0  # 2 a second
        assert all(e.cpu_pct >= 0 and e.rss_mb > 50 and e.procs >= 1 for e in mine)
        assert all(e.node and 0 < e.host_mem_used_mb < e.host_mem_total_mb for e in mine)
        assert max(e.cpu_pct for e in mine) > 1.0  # its engine or trainer worked
        if importlib.util.find_spec("pynvml") is None:
            assert all(e.gpu == {} for e in mine)
