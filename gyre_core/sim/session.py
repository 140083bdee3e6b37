"""What the simulator keeps of each agent rollout in flight, and its run's counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gyre_core.sim.ps_queue import Call
from gyre_core.sim.workload import TraceRollout


@dataclass(slots=True)
class Session:
    """One agent rollout in flight: its position in the trace and what it produced."""

    index: int
    trace: TraceRollout
    start: float
    deadline: float
    turn: int = 0
    context: int = 0
    unit: int = -1  # engine of its current or last call
    call: Call | None = None
    queued: bool = False
    fresh: int = 0  # tokens a queued call prefills on its own engine (the rest is cached)
    versions: Counter[int] = field(default_factory=Counter)  # decoded tokens by version
    tokens: int = 0  # tokens its tree holds (prompts, completions, summaries)
    status: str = "running"
    finished: float = 0.0


@dataclass
class Stats:
    sessions_restarted: int = 0
    calls_migrated: int = 0
    tokens_reprefilled: int = 0
    tokens_discarded: int = 0  # decoded, then thrown away by a restart
    tokens_trained: int = 0
    step_tokens: list[int] = field(default_factory=list)  # tokens each step trained
    tokens_prefilled: int = 0
    tokens_masked: int = 0
    groups_dropped_stale: int = 0  # complete groups past the staleness bound, never trained
    rollouts_dropped: int = 0  # their rollouts (as many more sessions were started)
    staleness: Counter[int] = field(default_factory=Counter)
    timeouts: int = 0
    events: int = 0
    peak_rollouts: int = 0  # the most rollouts running at once
