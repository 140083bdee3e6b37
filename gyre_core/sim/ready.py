"""The simulator's finished sessions not yet trained, and which of them steps take: the
runtime's own rule (:mod:`gyre_core.scheduler.batching`; a session's group is its index
// ``group_size``, as in the trace generators and the run loop)."""

from __future__ import annotations

from dataclasses import replace

from gyre_core.scheduler import batching
from gyre_core.sim.costs import CostModel
from gyre_core.sim.session import Session, Stats
from gyre_core.sim.workload import TraceRollout


class Ready:
    def __init__(self, sessions: list[Session], costs: CostModel, order: str, stats: Stats):
        self.sessions, self.costs, self.order, self.stats = sessions, costs, order, stats
        self.ids: list[int] = []  # finished sessions not yet trained, in finish order
        self.tokens = 0  # the tokens those sessions hold
        self.extra: list[TraceRollout] = []  # sessions run in place of dropped stale groups
        self.batches: list[list[int]] = []  # each step's sessions, as batching chose them
        self.reported = 0  # stale groups counted in steps' figures so far
        self._selection: tuple[int, batching.Selection] | None = None  # by version

    @property
    def grouped(self) -> bool:
        """Whether ``arrival`` takes whole groups (and may drop stale ones)."""
        return self.order == batching.ARRIVAL and self.costs.group_size > 1

    def add(self, s: Session) -> None:
        self.ids.append(s.index)
        self.tokens += s.tokens
        self._selection = None

    def selection(self, version: int) -> batching.Selection:
        """batching.py's choice over the ready sessions at ``version`` (remade when they
        or the version change)."""
        if self._selection is None or self._selection[0] != version:
            spans = [_span(self.sessions[i]) for i in self.ids]
            groups = batching.Groups(self.costs.group_size, spans, self.costs.staleness)
            b = self.costs.rollouts_per_step
            self._selection = (version, batching.select(self.ids, b, version, self.order, groups))
        return self._selection[1]

    def usable(self, version: int) -> tuple[int, int]:
        """The sessions the next steps can take and their tokens (the policy's view)."""
        if not self.grouped and self.order == batching.ARRIVAL:
            return len(self.ids), self.tokens
        usable = self.selection(version).usable
        return len(usable), sum(self.sessions[self.ids[p]].tokens for p in usable)

    def drop_stale(self, version: int) -> None:
        """Complete groups every token of which is past the staleness bound leave untrained,
        counted; as many sessions (copies of their trace rollouts) are added so that the
        run still fills its steps (the runtime does the same)."""
        stale = set(self.selection(version).stale) if self.grouped else set()
        if not stale:
            return
        dropped = [self.ids[p] for p in sorted(stale)]
        self._remove(stale, dropped)
        self.stats.groups_dropped_stale += len(dropped) // self.costs.group_size
        self.stats.rollouts_dropped += len(dropped)
        for i in dropped:
            tr = self.sessions[i].trace
            again = f"{tr.rollout_id}+{len(self.extra)}"
            self.extra.append(replace(tr, rollout_id=again, group_id=f"{tr.group_id}+"))

    def take(self, version: int) -> list[int] | None:
        """The next step's sessions, taken out of the ready ones (None: no full batch)."""
        b = self.costs.rollouts_per_step
        if len(self.ids) < b:
            return None
        if self.grouped or self.order != batching.ARRIVAL:
            self.drop_stale(version)
            picked = self.selection(version).usable[:b]
        else:
            picked = list(range(b))
        if len(picked) < b:
            return None
        batch = [self.ids[p] for p in picked]
        self._remove(set(picked), batch)
        self.batches.append(batch)
        return batch

    def _remove(self, positions: set[int], ids: list[int]) -> None:
        self.ids = [i for p, i in enumerate(self.ids) if p not in positions]
        self.tokens -= sum(self.sessions[i].tokens for i in ids)
        self._selection = None

    def step_metrics(self) -> dict[str, float]:
        """A step's figures: tokens masked so far and, when ``arrival`` takes whole groups,
        the stale groups dropped since the step before."""
        out = {"tokens_masked": float(self.stats.tokens_masked)}
        if self.grouped:
            dropped = self.stats.groups_dropped_stale
            out["groups_dropped_stale"] = float(dropped - self.reported)
            self.reported = dropped
        return out


def _span(s: Session) -> batching.Span:
    """The oldest and newest version of the session's decoded tokens (None: none)."""
    versions = [v for v, n in s.versions.items() if n > 0]
    return (min(versions), max(versions)) if versions else None
