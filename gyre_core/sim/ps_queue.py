"""Engines as processor-sharing queues (``sim.router`` feeds them).

A rollout unit's engine decodes its ``n`` sequences together, each at
``CostModel.seq_rate(n)`` tokens/s. Instead of updating every sequence when ``n`` changes,
the engine keeps a *virtual clock* ``V`` (tokens each sequence has received since the
engine started): a call needing ``w`` tokens of service finishes when ``V`` reaches its
start value plus ``w``; the engine's next completion is one heap lookup. Prefill is
service too, compute-bound at ``prefill_tok_s`` per unit and shared like the rest: the
router converts it to token-equivalents at the load the call joins (``Router.place``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from gyre_core.sim.costs import CostModel


@dataclass(slots=True)
class Call:
    rollout: int
    completion: int  # tokens to decode
    prefill_eq: float  # prefill work in token-equivalents, served before decoding
    vstart: float = 0.0
    done: int = 0  # decoded tokens already attributed to a version
    seq: int = 0
    cancelled: bool = False

    @property
    def work(self) -> float:
        return self.prefill_eq + self.completion


@dataclass
class Engine:
    """One rollout unit's inference engine."""

    unit: int
    costs: CostModel
    version: int = 0
    v: float = 0.0  # virtual clock
    t_last: float = 0.0
    paused_until: float = 0.0  # weight sync in progress until then
    accepting: bool = True
    epoch: int = 0  # bumped with every completion event scheduled; older ones are ignored
    pending: float | None = None  # time of the completion event in force
    active: dict[int, Call] = field(default_factory=dict)
    heap: list[tuple[float, int]] = field(default_factory=list)
    _n: int = -1
    _rate: float = 0.0

    @property
    def load(self) -> int:
        return len(self.active)

    def rate(self) -> float:
        n = len(self.active)
        if n != self._n:  # cached: the rate changes only with the load
            self._n, self._rate = n, self.costs.seq_rate(n)
        return self._rate

    def advance(self, t: float) -> None:
        # The hottest function of the simulator: plain comparisons, no max() calls.
        last = self.t_last
        if t <= last:
            return
        start = last if last >= self.paused_until else self.paused_until
        n = len(self.active)
        if t > start and n:
            if n != self._n:  # rate(), inlined
                self._n, self._rate = n, self.costs.seq_rate(n)
            self.v += (t - start) * self._rate
        self.t_last = t

    def add(self, call: Call, t: float) -> None:
        self.advance(t)
        call.vstart = self.v
        self.active[call.seq] = call
        heapq.heappush(self.heap, (self.v + call.work, call.seq))

    def remove(self, call: Call, t: float) -> int:
        """Take a running call off; returns the tokens it has decoded so far."""
        self.advance(t)
        call.cancelled = True
        del self.active[call.seq]
        return self.decoded(call)

    def decoded(self, call: Call) -> int:
        served = self.v - call.vstart - call.prefill_eq
        return max(0, min(call.completion, int(served + 1e-6)))  # float noise below a token

    def pop_finished(self, t: float) -> list[Call]:
        self.advance(t)
        out = []
        while self.heap and self.heap[0][0] <= self.v + 1e-6:
            _, seq = heapq.heappop(self.heap)
            call = self.active.pop(seq, None)
            if call is not None and not call.cancelled:
                out.append(call)
        return out

    def next_completion(self, t: float) -> float | None:
        while self.heap and self.heap[0][1] not in self.active:
            heapq.heappop(self.heap)  # drop cancelled entries
        if not self.heap:
            return None
        start = t if t >= self.paused_until else self.paused_until
        left = self.heap[0][0] - self.v
        return start + (left if left > 0.0 else 0.0) / self.rate()

    def pause(self, t: float, until: float) -> None:
        self.advance(t)
        self.paused_until = max(self.paused_until, until)
