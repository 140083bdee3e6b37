"""The events of a run, defined once for the simulator, the runtime, the database and the
websocket (DESIGN.md, "Events"). Every event has ``kind``, ``t`` (seconds on the run's
clock — simulated time for a simulated run) and ``wall`` (UTC timestamp); the rest is the
kind's data. Add a kind to DESIGN.md before emitting it.

gyre_core reports what happens through an :class:`EventSink` it is handed; the worker's
sink writes to Postgres and broadcasts, tests collect into a :class:`ListSink`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import IO, Any, ClassVar, Protocol

from gyre_core.cluster import ROLES  # the roles a role_change names

# What no store takes: NUL (PostgreSQL's text and jsonb refuse it) and lone surrogates
# (UTF-8 cannot encode them; jsonb refuses their escapes).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
NUL_MARK, SURROGATE_MARK = "\u2400", "\ufffd"  # ␀ and the replacement character, visibly


def storable_text(text: str) -> str:
    """``text`` as every store takes it: NUL becomes ␀, a lone surrogate U+FFFD."""
    if _UNSTORABLE.search(text) is None:
        return text
    return _UNSTORABLE.sub(lambda m: NUL_MARK if m.group() == "\x00" else SURROGATE_MARK, text)


def storable(value: Any) -> Any:
    """A JSON-shaped value with :func:`storable_text` applied to every string in it (dict
    keys included) and every NaN or infinite number made null (JSON has neither, and
    Postgres' jsonb refuses them): what events and derived rows carry into a database."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(storable(v) for v in value)
    return value


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: ClassVar[str] = ""
    t: float
    wall: str = field(default_factory=_now)

    def data(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("t", "wall")}

    def to_json(self) -> dict[str, Any]:
        """The event as every sink writes it, its text made storable (see ``storable``)."""
        return {"kind": self.kind, "t": self.t, "wall": self.wall, "data": storable(self.data())}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStatus(Event):
    kind: ClassVar[str] = "run_status"
    status: str
    step: int
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleChange(Event):
    kind: ClassVar[str] = "role_change"
    unit: int
    gpus: list[int]
    from_role: str
    to_role: str
    node: str = ""  # the Ray node id hosting the unit (real runtime; "" when simulated)
    # seconds of the switch's parts (real runtime): drain_s, engine_stop_s, engine_start_s,
    # and for the training group reform_s, transfer_s (from a peer), restore_s, offload_s
    parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutStarted(Event):
    kind: ClassVar[str] = "rollout_started"
    rollout_id: str
    task_id: str
    group_id: str
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutProgress(Event):
    kind: ClassVar[str] = "rollout_progress"
    rollout_id: str
    turns: int
    tokens: int
    progress: float
    branches: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutFinished(Event):
    kind: ClassVar[str] = "rollout_finished"
    rollout_id: str
    status: str
    progress: float
    reward: float
    turns: int
    tokens: int
    versions: tuple[int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallMigrated(Event):
    kind: ClassVar[str] = "call_migrated"
    rollout_id: str
    from_unit: int
    to_unit: int
    tokens_kept: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFinished(Event):
    kind: ClassVar[str] = "step_finished"
    step: int
    version: int
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Benchmark(Event):
    kind: ClassVar[str] = "benchmark"
    step: int
    suite: str
    score: float
    tasks: int
    samples: int = 0  # draws a task at the rollout temperature (0: greedy, one a task)


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeReady(Event):
    kind: ClassVar[str] = "tree_ready"
    group_id: str
    rollouts: int
    tokens_unique: int
    tokens_per_call: int
    nodes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutsWritten(Event):
    """The token payload of the rollouts one training step used: ``path`` is the absolute
    path of a ``gyre.trajectory/v1`` JSONL file (written whole, then renamed into place)
    holding their records; ``rollouts`` counts them and ``groups`` lists their group ids.
    Emitted by the real runtime after each step (after that step's ``tree_ready`` events);
    benchmark rollouts are not written (they form no group). The worker imports the file
    into the run's rollouts and trees and keeps a copy in the platform's data dir."""

    kind: ClassVar[str] = "rollouts_written"
    step: int
    path: str
    rollouts: int
    groups: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseProgress(Event):
    """Where a long phase of a run is: ``done`` of ``total`` (steps, tasks, units) of
    ``phase`` ("model build", "engine start", "warm start", "warm start (anneal)",
    "benchmark"), with a short ``message`` ("loss 0.412 (target 0.12)", "version 0,
    greedy"). A phase sends one at its start (``done`` 0) and its last has ``done`` equal
    to ``total``, or fewer where it ended early (a warm start at its target loss)."""

    kind: ClassVar[str] = "phase_progress"
    phase: str
    done: int
    total: int
    message: str = ""

    def line(self) -> str:
        """``warm start 250/1000, loss 0.412 (target 0.12)``: how a terminal shows it."""
        head = f"{self.phase} {self.done}/{self.total}"
        return f"{head}, {self.message}" if self.message else head


@dataclass(frozen=True, slots=True, kw_only=True)
class SysMetrics(Event):
    """One unit's system metrics at ``t`` (real runtime, every ``cluster.sysmetrics_s``;
    :mod:`gyre_core.runtime.sysmetrics`): ``cpu_pct`` (100 = one core) and ``rss_mb`` of
    its ``procs`` processes (each of its processes and their descendants), the memory of
    the ``node`` hosting it, and ``gpu`` through NVML: ``util_pct`` (mean over the unit's
    GPUs), ``mem_mb`` and ``mem_total_mb`` (summed), ``count`` — empty without NVML or
    GPUs. ``host_mem_*`` are 0 where the node has no /proc/meminfo."""

    kind: ClassVar[str] = "sys_metrics"
    unit: int
    cpu_pct: float
    rss_mb: float
    procs: int = 1
    node: str = ""
    host_mem_used_mb: float = 0.0
    host_mem_total_mb: float = 0.0
    gpu: dict[str, float] = field(default_factory=dict)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RunStatus,
        RoleChange,
        RolloutStarted,
        RolloutProgress,
        RolloutFinished,
        CallMigrated,
        StepFinished,
        Benchmark,
        TreeReady,
        RolloutsWritten,
        PhaseProgress,
        SysMetrics,
    )
}


def event_from_json(obj: dict[str, Any]) -> Event:
    cls = EVENT_TYPES.get(obj.get("kind", ""))
    if cls is None:
        raise ValueError(f"unknown event kind {obj.get('kind')!r}")
    data = dict(obj.get("data", {}))
    if cls is RolloutFinished:
        data["versions"] = tuple(data["versions"])
    return cls(t=float(obj["t"]), wall=str(obj["wall"]), **data)


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...


def flush_sink(sink: EventSink) -> None:
    """Store what ``sink`` holds, if it buffers (a sink that does has ``flush()``): a job
    calls this before it records a checkpoint, so a checkpoint never runs ahead of the
    events the sink has stored."""
    flush = getattr(sink, "flush", None)
    if callable(flush):
        flush()


class ListSink:
    """Collects events in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class NullSink:
    def emit(self, event: Event) -> None:
        pass


class TeeSink:
    """Every event to each of ``sinks``, in order; ``flush`` flushes each."""

    def __init__(self, sinks: list[EventSink]) -> None:
        self.sinks = sinks

    def emit(self, event: Event) -> None:
        for sink in self.sinks:
            sink.emit(event)

    def flush(self) -> None:
        for sink in self.sinks:
            flush_sink(sink)


class JsonlSink:
    """One event per line, as ``Event.to_json``."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def emit(self, event: Event) -> None:
        self.fh.write(json.dumps(event.to_json(), separators=(",", ":")) + "\n")


__all__ = [
    "EVENT_TYPES",
    "ROLES",
    "Benchmark",
    "CallMigrated",
    "Event",
    "EventSink",
    "JsonlSink",
    "ListSink",
    "NullSink",
    "PhaseProgress",
    "RoleChange",
    "RolloutFinished",
    "RolloutProgress",
    "RolloutStarted",
    "RolloutsWritten",
    "RunStatus",
    "StepFinished",
    "SysMetrics",
    "TreeReady",
    "flush_sink",
    "storable",
    "storable_text",
]
