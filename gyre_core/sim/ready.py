"""The simulator's finished sessions not yet trained, and which of them steps take: the
runtime's own rule (:mod:`gyre_core.scheduler.batching`; a session's group is its index
// ``group_size``, as in the trace generators and the run loop). Whole groups are kept
as they complete (:class:`~gyre_core.scheduler.batching.Complete`) and ranked by
``batching.rank``, so that a long trace does not re-read every ready session per event."""

from __future__ import annotations

from dataclasses import replace

from gyre_core.scheduler import batching
from gyre_core.sim.costs import CostModel
from gyre_core.sim.session import Session, Stats
from gyre_core.sim.workload import TraceRollout

Ranked = tuple[list[batching.Complete], list[batching.Complete]]


class Ready:
    def __init__(self, sessions: list[Session], costs: CostModel, order: str, stats: Stats):
        self.sessions, self.costs, self.order, self.stats = sessions, costs, order, stats
        self.size = costs.group_size
        self.grouped = order == batching.ARRIVAL and self.size > 1  # whole groups, stale drop
        self.ids: list[int] = []  # finished sessions not yet trained, in finish order
        self.tokens = 0  # the tokens those sessions hold
        self.members: dict[int, list[int]] = {}  # grouped: ready sessions by group
        self.complete: dict[int, batching.Complete] = {}  # grouped: groups all finished
        self.finished = 0  # sessions finished so far (a group's ``last``)
        self.extra: list[TraceRollout] = []  # sessions run in place of dropped stale groups
        self.batches: list[list[int]] = []  # each step's sessions, as batching chose them
        self.reported = 0  # stale groups counted in steps' figures so far
        self._ranked: tuple[int, Ranked] | None = None  # by version
        self._usable: tuple[Ranked | None, tuple[int, int]] = (None, (0, 0))  # of a ranking

    def add(self, s: Session) -> int:
        """``s`` finished: the sessions it makes trainable (its whole group once it is
        complete, else none; itself without groups)."""
        self.ids.append(s.index)
        self.tokens += s.tokens
        self.finished += 1
        if not self.grouped:
            return 1
        g = s.index // self.size
        members = self.members.setdefault(g, [])
        members.append(s.index)
        if len(members) == self.size:
            span = batching.merge(_span(self.sessions[i]) for i in members)
            self.complete[g] = batching.Complete(g, span, self.finished)
            self._ranked = None
            return self.size
        return 0

    def ranked(self, version: int) -> Ranked:
        """``batching.rank`` of the complete groups at ``version`` (kept until they or the
        version change)."""
        if self._ranked is None or self._ranked[0] != version:
            found = batching.rank(self.complete.values(), version, self.costs.staleness)
            self._ranked = (version, found)
        return self._ranked[1]

    def usable(self, version: int) -> tuple[int, int]:
        """The sessions the next steps can take and their tokens (the policy's view)."""
        if self.grouped:  # asked on every decision: counted once a ranking
            ranked = self.ranked(version)
            if self._usable[0] is not ranked:
                ids = [i for g in ranked[0] for i in self.members[g.number]]
                self._usable = (ranked, (len(ids), sum(self.sessions[i].tokens for i in ids)))
            return self._usable[1]
        if self.order == batching.ARRIVAL:
            return len(self.ids), self.tokens
        b = self.costs.rollouts_per_step
        usable = batching.usable(self.ids, b, version, self.order)
        return len(usable), sum(self.sessions[self.ids[p]].tokens for p in usable)

    def drop_stale(self, version: int) -> None:
        """Complete groups every token of which is past the staleness bound leave untrained,
        counted; as many sessions (copies of their trace rollouts) are added so that the
        run still fills its steps (the runtime does the same)."""
        if not self.grouped:
            return
        stale = self.ranked(version)[1]
        if not stale:
            return
        dropped = self._remove_groups(stale)
        self.stats.groups_dropped_stale += len(stale)
        self.stats.rollouts_dropped += len(dropped)
        for i in dropped:
            tr = self.sessions[i].trace
            again = f"{tr.rollout_id}+{len(self.extra)}"
            self.extra.append(replace(tr, rollout_id=again, group_id=f"{tr.group_id}+"))

    def take(self, version: int, limit: int = 0) -> list[int] | None:
        """The next step's sessions, taken out of the ready ones (None: no full batch).
        ``limit`` > 0 (a streaming step): whatever is ready of at most ``limit`` rollouts,
        whole groups, oldest first (None: nothing)."""
        b = limit or self.costs.rollouts_per_step
        if not self.ids or (not limit and len(self.ids) < b):
            return None
        if self.grouped:
            self.drop_stale(version)
            groups = self.ranked(version)[0][: b // self.size]
            if not groups or (not limit and len(groups) * self.size < b):
                return None
            batch = self._remove_groups(groups)
        else:
            picked = (
                list(range(min(b, len(self.ids))))
                if self.order == batching.ARRIVAL
                else batching.take(self.ids, b, version, self.order)
            )
            if picked is None:
                return None
            batch = [self.ids[p] for p in picked]
            self._remove(batch)
        self.batches.append(batch)
        return batch

    def _remove_groups(self, groups: list[batching.Complete]) -> list[int]:
        ids = [i for g in groups for i in sorted(self.members.pop(g.number))]
        for g in groups:
            del self.complete[g.number]
        self._remove(ids)
        return ids

    def _remove(self, ids: list[int]) -> None:
        gone = set(ids)
        self.ids = [i for i in self.ids if i not in gone]
        self.tokens -= sum(self.sessions[i].tokens for i in ids)
        self._ranked = None

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
