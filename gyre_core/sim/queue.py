"""The simulator's clock and event queue, and the kinds of event it holds.

An event is ``(t, seq, kind, a, b)``: ``seq`` orders events of the same time by when they
were pushed; ``a`` and ``b`` are the kind's two integer arguments (a unit, a session, an
epoch, a step). Kinds are ints, cheaper to compare than strings. The queue's counter also
numbers the engines' calls (:meth:`EventQueue.next_seq`), one sequence for both.
"""

from __future__ import annotations

import heapq

# a session's next call is ready / an engine's next completion / a session's deadline /
# a unit has loaded its new role / a draining unit's drain deadline / a training step ends
READY, DONE, DEADLINE, SWITCHED, DRAINED, STEP = range(6)


class EventQueue:
    def __init__(self) -> None:
        self.t = 0.0  # the simulated clock: the time of the last event popped
        self.seq = 0
        self.heap: list[tuple[float, int, int, int, int]] = []

    def __bool__(self) -> bool:
        return bool(self.heap)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def pop(self) -> tuple[int, int, int]:
        """The next event's kind and arguments; the clock moves to its time."""
        t, _, kind, a, b = heapq.heappop(self.heap)
        self.t = t
        return kind, a, b
