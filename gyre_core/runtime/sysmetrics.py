"""System metrics of a real run's units: CPU and memory of each unit's processes, the
host's memory, and, where NVML answers, its GPUs' utilisation and memory.

Each unit process samples itself (:class:`ProcessSampler`, called through the unit actor's
``sys_metrics``): its own process and every descendant (a vLLM server and its workers),
read from ``/proc`` on the node it runs on, so a unit on another node of the cluster is
measured where it is. The driver polls every unit every ``cluster.sysmetrics_s`` seconds
(:class:`SysMetricsPoller`, an asyncio task beside the loop) and emits one
:class:`~gyre_core.events.SysMetrics` event per unit. Sampling never fails a run: a unit
that does not answer in time, or a machine without ``/proc`` or NVML, gives fewer fields
or no event for that round. A simulated run has no unit processes and emits none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gyre_core import events as ev

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MB = 1024 * 1024


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, user + system clock ticks) of ``pid``, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(rest[1]), int(rest[11]) + int(rest[12])


def _rss_bytes(pid: int) -> int:
    try:
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def process_tree(pid: int) -> dict[int, int]:
    """``pid`` and its descendants -> their CPU clock ticks so far (one scan of /proc)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in PROC.iterdir():
            if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
                parents[int(entry.name)], ticks[int(entry.name)] = st
    if pid not in ticks:
        return {}
    tree, frontier = {pid}, [pid]
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return {p: ticks[p] for p in tree}


def host_memory_mb() -> dict[str, float]:
    """``host_mem_used_mb`` (total less available) and ``host_mem_total_mb``; {} without
    /proc/meminfo."""
    try:
        lines = (PROC / "meminfo").read_text().splitlines()
    except OSError:
        return {}
    kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines) if v}
    if "MemTotal" not in kb or "MemAvailable" not in kb:
        return {}
    total = kb["MemTotal"] / 1024
    return {"host_mem_used_mb": total - kb["MemAvailable"] / 1024, "host_mem_total_mb": total}


def gpu_stats(gpu_ids: Sequence[int]) -> dict[str, float]:
    """Utilisation (mean %) and memory of ``gpu_ids`` (NVML indices) through NVML, when the
    ``pynvml`` module (``nvidia-ml-py``) imports and the driver answers; else {}."""
    if not gpu_ids:
        return {}
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        util, used, total = 0.0, 0.0, 0.0
        for i in gpu_ids:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(i))
            util += float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = used + mem.used / MB, total + mem.total / MB
        return {
            "util_pct": util / len(gpu_ids),
            "mem_mb": used,
            "mem_total_mb": total,
            "count": float(len(gpu_ids)),
        }
    except Exception:  # NVMLError and its kin: no driver, a lost GPU
        return {}


class ProcessSampler:
    """One process's sampler (its tree): CPU % since the previous sample (100 = one core),
    resident memory, the host's memory and its GPUs. The first sample's CPU % averages over
    the ticks counted since the sampler was made."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self._ticks: dict[int, int] = process_tree(self.pid)
        self._at = time.monotonic()

    def sample(self, gpu_ids: Sequence[int] = ()) -> dict[str, Any]:
        ticks = process_tree(self.pid)
        now = time.monotonic()
        spent = sum(t - self._ticks.get(p, t) for p, t in ticks.items())  # new ones: from now
        elapsed = max(now - self._at, 1e-6)
        self._ticks, self._at = ticks, now
        out: dict[str, Any] = {
            "procs": len(ticks),
            "cpu_pct": 100.0 * spent / _TICK / elapsed,
            "rss_mb": sum(_rss_bytes(p) for p in ticks) / MB,
        }
        return {**out, **host_memory_mb(), "gpu": gpu_stats(gpu_ids)}


def combine(unit: int, node: str, samples: Sequence[dict[str, Any]], t: float) -> ev.SysMetrics:
    """One unit's event from its processes' samples (summed; GPU utilisation averaged by
    GPU; the host's memory from the first process, whose node hosts the whole unit)."""
    gpus = [s["gpu"] for s in samples if s.get("gpu")]
    gpu: dict[str, float] = {}
    if gpus:
        count = sum(g["count"] for g in gpus)
        gpu = {
            "util_pct": sum(g["util_pct"] * g["count"] for g in gpus) / count,
            "mem_mb": sum(g["mem_mb"] for g in gpus),
            "mem_total_mb": sum(g["mem_total_mb"] for g in gpus),
            "count": count,
        }
    first = samples[0]
    return ev.SysMetrics(
        t=t,
        unit=unit,
        node=node,
        procs=sum(int(s["procs"]) for s in samples),
        cpu_pct=round(sum(float(s["cpu_pct"]) for s in samples), 2),
        rss_mb=round(sum(float(s["rss_mb"]) for s in samples), 1),
        host_mem_used_mb=round(float(first.get("host_mem_used_mb", 0.0)), 1),
        host_mem_total_mb=round(float(first.get("host_mem_total_mb", 0.0)), 1),
        gpu={k: round(v, 2) for k, v in gpu.items()},
    )


class SysMetricsPoller:
    """Every ``interval_s``, ask each unit's processes for a sample (``sys_metrics`` on the
    unit actors) and emit the unit's event: a task per unit, so that a unit whose actor is
    busy (an engine's forward pass holds its event loop) delays only its own sample. A
    sample that takes longer than ``TIMEOUT_S`` is dropped; a dead unit is no longer
    asked; a sink that raises ends the poller (the run reports the sink's failure)."""

    TIMEOUT_S = 30.0

    def __init__(
        self,
        interval_s: float,
        units: Callable[[], Sequence[Any]],
        sink: ev.EventSink,
        clock: Callable[[], float],
    ) -> None:
        self.interval_s, self.units, self.sink, self.clock = interval_s, units, sink, clock
        self.tasks: list[asyncio.Task[None]] = []
        self.emitted = 0
        self.sink_failed = False

    def start(self) -> None:
        if self.interval_s > 0 and not self.tasks:
            loop = asyncio.get_running_loop()
            self.tasks = [loop.create_task(self._poll(slot)) for slot in self.units()]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        # their CancelledError comes back as a result; a cancel of the caller still raises
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []

    async def _poll(self, slot: Any) -> None:
        next_at = time.monotonic()
        while not slot.dead and not self.sink_failed:
            event = await self._one(slot)
            if event is not None:
                try:
                    self.sink.emit(event)
                except Exception:
                    self.sink_failed = True
                    return
                self.emitted += 1
            next_at = max(next_at + self.interval_s, time.monotonic())
            await asyncio.sleep(next_at - time.monotonic())

    async def _one(self, slot: Any) -> ev.SysMetrics | None:
        try:
            samples = await asyncio.wait_for(
                asyncio.gather(*(p.sys_metrics.remote() for p in slot.procs)),
                timeout=max(self.interval_s, self.TIMEOUT_S),
            )
            return combine(slot.id, slot.node, samples, self.clock())
        except Exception:  # a dead unit, or one stuck past the timeout: none this round
            return None
