"""The simulator's router: which engine serves an agent session's next call.

A session's calls go to its own engine (its last one, whose prefix cache holds the
context) while that has room, wait for it while waiting costs less than re-prefilling the
whole context elsewhere, or go to the least loaded engine; with no engine free they queue
(``shared``). :meth:`Router.route` states the rule; :meth:`Router.fill` hands queued calls
to an engine with room; :meth:`Router.schedule` keeps each engine's next completion on the
event queue.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from gyre_core.cluster import ROLLOUT, Cluster
from gyre_core.sim.costs import CostModel
from gyre_core.sim.ps_queue import Call, Engine
from gyre_core.sim.queue import DONE, EventQueue
from gyre_core.sim.session import Session, Stats


class Router:
    """Routes the calls of ``sessions`` (the simulator's list) to ``engines`` (the list the
    simulator owns); ``account(u)`` closes unit ``u``'s GPU-time interval before a call
    joins its engine."""

    def __init__(
        self,
        cluster: Cluster,
        engines: list[Engine],
        costs: CostModel,
        queue: EventQueue,
        sessions: list[Session],
        stats: Stats,
        account: Callable[[int], None],
    ) -> None:
        self.cluster, self.engines, self.costs = cluster, engines, costs
        self.queue, self.sessions, self.stats, self.account = queue, sessions, stats, account
        n = len(cluster)
        self.shared: deque[int] = deque()  # queued calls with no engine of their own
        # queued calls waiting for their own engine (its prefix cache), one queue a unit
        self.waiting: list[deque[int]] = [deque() for _ in range(n)]
        # the units whose waiting queue holds an entry (live or not): steal looks only at
        # them, instead of every unit's queue on each engine refill
        self.nonempty: set[int] = set()
        self.queued = 0  # calls queued in either
        self.affinity = [0] * n  # live sessions whose prefix cache is on each unit

    def route(self, s: Session, call: Call, fresh: int) -> None:
        """Send a call to an engine: its own (its last one, whose prefix cache holds the
        context: only the ``fresh`` tokens are prefilled) if that has room; if it is full,
        the call waits for it unless the wait costs more than re-prefilling the whole
        context on the least loaded engine with room; with no engine of its own, that
        engine; with none, the router's queue."""
        cap = self.costs.max_seqs_per_unit
        own = self.engines[s.unit] if s.unit >= 0 else None
        if own is not None and not (own.accepting and self.cluster.roles[own.unit] == ROLLOUT):
            self.set_unit(s, -1)
            own = None
        crowded = own is not None and self.crowded(own)
        if own is not None and len(own.active) < cap and not crowded:
            self.place(s, call, own, fresh)
            return
        other = self.least_loaded(exclude=s.unit)
        # full: wait for it, or re-prefill elsewhere?
        if own is not None and not crowded and (other is None or self.waits(s, own, other, fresh)):
            self.enqueue(s, call, own.unit, fresh)
            return
        if other is None:
            self.set_unit(s, -1)
            self.enqueue(s, call, -1, s.context)
            return
        self.place(s, call, other, s.context)

    def least_loaded(self, exclude: int = -1) -> Engine | None:
        """The accepting rollout engine with the fewest calls and room for one more."""
        e, best = None, self.costs.max_seqs_per_unit
        roles = self.cluster.roles
        for cand in self.engines:
            n = len(cand.active)
            if n < best and cand.unit != exclude and cand.accepting and roles[cand.unit] == ROLLOUT:
                e, best = cand, n
        return e

    def wait_s(self, e: Engine, k: int) -> float:
        """How long the ``k``-th call queued for a full engine waits for a slot: until its
        ``k``-th running call ends (a finished call's session spends its tool time away);
        beyond its running calls, without end."""
        ends = heapq.nsmallest(k, (v for v, seq in e.heap if seq in e.active))
        if len(ends) < k:
            return float("inf")
        e.advance(self.queue.t)
        paused = e.paused_until - self.queue.t if e.paused_until > self.queue.t else 0.0
        return paused + max(0.0, ends[-1] - e.v) / e.rate()

    def waits(self, s: Session, own: Engine, other: Engine, fresh: int) -> bool:
        """Whether a call waiting for its full engine ``own`` costs no more time than
        re-prefilling its cached context on ``other``."""
        wait = self.wait_s(own, len(self.waiting[own.unit]) + 1)
        return wait <= self.reprefill_s(s.context - fresh, other)

    def reprefill_s(self, tokens: int, e: Engine) -> float:
        """Seconds to prefill ``tokens`` more on ``e`` at the load the call joins."""
        return tokens * (e.load + 1) / self.costs.prefill_tok_s

    def enqueue(self, s: Session, call: Call, unit: int, fresh: int) -> None:
        """Queue a call for engine ``unit``'s slot (-1: for any engine)."""
        s.call, s.queued, s.fresh = call, True, fresh
        if unit < 0:
            self.shared.append(s.index)
        else:
            self.waiting[unit].append(s.index)
            self.nonempty.add(unit)
        self.queued += 1

    def place(self, s: Session, call: Call, e: Engine, fresh: int) -> None:
        # Prefill is compute-bound at prefill_tok_s per unit. Under processor sharing a
        # sequence gets 1/n of the unit, so k tokens take k * n / prefill_tok_s seconds,
        # i.e. k * D(n) / prefill_tok_s token-equivalents at the per-sequence rate, with
        # D(n) = n * seq_rate(n) the unit's decode throughput at the load it joins.
        c, n = self.costs, len(e.active) + 1  # n * seq_rate(n), inlined: a hot path
        call.prefill_eq = fresh * n * c.decode_peak_tok_s / (n + c.decode_half) / c.prefill_tok_s
        self.stats.tokens_prefilled += fresh
        call.seq = self.queue.next_seq()
        s.call, s.queued = call, False
        self.set_unit(s, e.unit)
        self.account(e.unit)
        e.add(call, self.queue.t)
        self.schedule(e)

    def crowded(self, e: Engine) -> bool:
        """Cache-aware routing with a load-balance fallback, as the SGLang and vLLM routers
        do: a session leaves its engine (and its prefix cache: the whole context is
        prefilled again elsewhere) once that engine runs more than ``balance_abs`` calls
        above the least loaded engine in rollout and more than ``balance_rel`` times as
        many. Without it, sessions stay crowded on the engines they started on while a
        unit that just came back to rollout sits idle."""
        c, load = self.costs, len(e.active)
        if c.balance_abs <= 0 or load <= c.balance_abs:
            return False
        roles = self.cluster.roles
        least = min(len(o.active) for o in self.engines if o.accepting and roles[o.unit] == ROLLOUT)
        return load - least > c.balance_abs and load > c.balance_rel * least

    def schedule(self, e: Engine) -> None:
        """Make sure a completion event stands at or before the engine's next completion.
        An event that comes early is harmless (it finds nothing done and reschedules), so
        one already standing earlier is kept: adding a call only slows the others."""
        nxt = e.next_completion(self.queue.t)
        if nxt is None or (e.pending is not None and e.pending <= nxt):
            return
        e.epoch += 1
        e.pending = nxt
        self.queue.push(nxt, DONE, e.unit, e.epoch)

    def fill(self, e: Engine) -> None:
        """Hand queued calls to an engine that has room: first those waiting for it (only
        their fresh tokens prefilled), then those with no engine of their own, then, from
        the engine with the longest queue, the last waiter if its wait there costs more
        than re-prefilling its context here."""
        if not self.queued:  # no live call waits anywhere: the common case, kept cheap
            return
        cap = self.costs.max_seqs_per_unit
        mine = self.waiting[e.unit]
        while e.accepting and len(e.active) < cap:
            s = self.pop_queued(mine, e.unit) or self.pop_queued(self.shared, -1)
            if s is None:
                s = self.steal(e)
                if s is None:
                    return
            call, fresh = s.call, s.fresh
            assert call is not None
            if s.unit != e.unit:
                self.set_unit(s, e.unit)
                fresh = s.context
            self.place(s, call, e, fresh)

    def pop_queued(self, queue: deque[int], unit: int, *, tail: bool = False) -> Session | None:
        """The next live call in ``queue`` (the last with ``tail``), taken off it; entries
        of calls that timed out or moved are dropped on the way. ``unit``: the engine the
        queue waits for (-1: the router's own queue)."""
        found = None
        while queue:
            s = self.sessions[queue.pop() if tail else queue.popleft()]
            if s.status == "running" and s.queued and s.call is not None and s.unit == unit:
                s.queued = False
                self.queued -= 1
                found = s
                break
        if unit >= 0 and not queue:
            self.nonempty.discard(unit)
        return found

    def steal(self, e: Engine) -> Session | None:
        """The last call queued for the engine with the longest queue (the lowest unit of
        those as long), if its wait there costs more than re-prefilling it on ``e``."""
        if not self.nonempty:
            return None
        longest = min(self.nonempty, key=lambda u: (-len(self.waiting[u]), u))
        queue = self.waiting[longest]
        if longest == e.unit:
            return None
        s = self.sessions[queue[-1]]
        owner = self.engines[longest]
        if self.wait_s(owner, len(queue)) <= self.reprefill_s(s.context - s.fresh, e):
            return None
        return self.pop_queued(queue, longest, tail=True)

    def leave_rollout(self, u: int) -> None:
        """Unit ``u`` stops serving: the calls waiting for it lose its cache and go to the
        front of the router's queue, in their order; the idle sessions whose prefix cache
        it holds lose it."""
        waiters = [i for i in self.waiting[u] if self.sessions[i].unit == u]
        self.waiting[u].clear()
        self.nonempty.discard(u)
        for i in waiters:
            s = self.sessions[i]
            self.set_unit(s, -1)
            s.fresh = s.context
        self.shared.extendleft(reversed(waiters))
        for s in self.sessions:
            if s.unit == u and s.call is None:
                self.set_unit(s, -1)

    def set_unit(self, s: Session, unit: int) -> None:
        """Move a session's prefix cache (its affinity) to ``unit`` (-1: none)."""
        if s.unit >= 0:
            self.affinity[s.unit] -= 1
        if unit >= 0:
            self.affinity[unit] += 1
        s.unit = unit
