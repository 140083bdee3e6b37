"""The policy interface: a pure function from a snapshot of the cluster and the work in
flight to decisions. No I/O and no clock of its own: the simulator and the real runtime
call the same policy objects with the same snapshots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from gyre_core.cluster import ROLLOUT, SWITCHING, TRAIN


@dataclass(frozen=True, slots=True)
class Snapshot:
    t: float
    roles: tuple[str, ...]  # per unit: rollout, train, switching or idle
    targets: tuple[str, ...]  # per unit: the role it is switching to (its role if not switching)
    loads: tuple[int, ...]  # per unit: calls decoding on it (0 off rollout)
    affinity: tuple[int, ...]  # per unit: live sessions whose prefix cache it holds
    queued_calls: int  # calls waiting at the router for a free engine slot
    active_sessions: int  # rollouts started and not finished
    calls_in_flight: int  # sessions whose LLM call is on an engine or queued (not in a tool)
    ready: int  # finished rollouts not yet trained
    ready_tokens: int  # tokens those rollouts would train
    started: int  # rollouts started so far
    remaining: int  # rollouts of the trace not started yet
    version: int  # last published policy version (= training steps finished)
    steps_total: int
    training: bool  # a training step is running
    rollouts_per_step: int
    staleness: int
    max_seqs_per_unit: int
    switch_s: float
    train_tok_s: float  # per training unit
    # how many versions ahead of the policy a rollout may start (-1: ``staleness``, the
    # masking bound); admitting further ahead trains more tokens older than the bound
    admit_staleness: int = -1
    max_active: int = 0  # the most rollouts running at once (0: no cap)
    min_train: int = 1  # the fewest training units that hold the training state
    # boundary dispatch: rollouts are released in bursts of this many steps' batches, the
    # next burst only once every rollout of the last has ended (0: continuous admission)
    burst_steps: int = 0
    # streaming training (the simulator's ``--streaming``, the runtime's scheduler.streaming):
    # a step may open on the first whole groups ready and take the rest as they finish
    streaming: bool = False
    # What lending the training units to rollout between steps reads (elastic.py); the
    # defaults mean "unknown", and elastic then never lends the units holding the state.
    finish_rate: float = 0.0  # rollouts becoming trainable per second lately (FinishRate)
    mean_rollout_tokens: float = 0.0  # tokens of a recently finished rollout (FinishRate)
    prefill_tok_s: float = 0.0  # a rollout unit's prefill rate (0: re-prefill is free)
    drain_s: float = 0.0  # how long a unit leaving rollout lets its calls finish

    @property
    def units(self) -> int:
        return len(self.roles)

    def count(self, role: str) -> int:
        return sum(1 for r in self.targets if r == role)

    @property
    def switching(self) -> int:
        return sum(1 for r in self.roles if r == SWITCHING)

    def ready_units(self, role: str) -> list[int]:
        """Units that are in ``role`` now, not switching."""
        return [u for u, r in enumerate(self.roles) if r == role]

    @property
    def ahead(self) -> int:
        """How many versions ahead of the policy a rollout may start: ``admit_staleness``,
        else the staleness bound."""
        return self.staleness if self.admit_staleness < 0 else self.admit_staleness

    @property
    def admissible(self) -> int:
        """Rollouts that may start now: within the admission bound (``admit_staleness``,
        else the staleness bound) and the cap on running rollouts (:meth:`admissible_ahead`)."""
        return self.admissible_ahead(self.ahead)

    def admissible_ahead(self, ahead: int) -> int:
        """Rollouts that may start while running at most ``ahead`` versions ahead: rollout
        ``i`` (in start order) is trained around step ``i // B + 1``; it may start at version
        ``v`` only if that step minus 1 minus ``v`` is at most ``ahead``. Never more than the
        cap on running rollouts (``max_active``) leaves room for. Under boundary dispatch
        (``burst_steps`` > 0) rollouts start a whole burst at a time (``burst_steps``
        batches, at most ``ahead + 1``), once every rollout of the last burst has ended and
        admission allows the whole burst: the outstanding count only falls within a burst
        (the paper's baselines)."""
        limit = (self.version + ahead + 1) * self.rollouts_per_step
        n = max(0, min(self.remaining, limit - self.started))
        if self.max_active > 0:
            n = min(n, max(0, self.max_active - self.active_sessions))
        if self.burst_steps > 0:  # a whole burst or nothing, once the last has ended
            burst = min(self.burst_steps, ahead + 1) * self.rollouts_per_step
            whole = min(burst, self.remaining)
            if self.max_active > 0:
                whole = min(whole, self.max_active)
            return min(n, burst) if not self.active_sessions and n >= whole else 0
        return n

    @property
    def burst_ahead(self) -> int:
        """How far ahead an on-policy policy admits: its own batch, or under boundary
        dispatch a burst of ``burst_steps`` batches (the later ones trained off-policy),
        never further than the admission bound lets every policy."""
        return min(max(0, self.burst_steps - 1), self.ahead)


@dataclass(frozen=True, slots=True)
class Decision:
    targets: dict[int, str] = field(default_factory=dict)  # unit -> new role
    admit: int = 0  # rollouts to start now
    start_step: bool = False  # start a training step on the units now in the train role


class Policy(Protocol):
    name: str

    def initial_roles(self, units: int) -> list[str]: ...

    def decide(self, s: Snapshot) -> Decision: ...


def idle_rollout_units(s: Snapshot) -> list[int]:
    """Rollout units, cheapest to take first: fewest sessions whose prefix cache would be
    lost (each re-prefills its whole context elsewhere), then fewest calls to drain."""
    return sorted(s.ready_units(ROLLOUT), key=lambda u: (s.loads[u], s.affinity[u], -u))


def can_train(s: Snapshot) -> bool:
    """A step may start: none runs, a batch is ready (under streaming, a whole group), and
    the training units in place hold the training state (``min_train`` of them)."""
    units = len(s.ready_units(TRAIN))
    need = 1 if s.streaming else s.rollouts_per_step
    return not s.training and s.ready >= need and units >= max(1, s.min_train)


class FinishRate:
    """How fast finished rollouts become trainable (a GRPO group only once its last member
    finishes), over the last ``window`` times some did, and the mean tokens of the last
    ``window`` finished rollouts: what the simulator and the runtime put in a
    :class:`Snapshot` (``finish_rate``, ``mean_rollout_tokens``) so that a policy can
    predict when the next batch is ready."""

    def __init__(self, window: int = 64) -> None:
        self.arrivals: deque[tuple[float, int]] = deque(maxlen=window)
        self.tokens: deque[int] = deque(maxlen=window)
        self._usable = 0  # rollouts in ``arrivals``
        self._tok = 0  # tokens in ``tokens``

    def observe(self, t: float, tokens: int, usable: int) -> None:
        """A rollout of ``tokens`` finished at ``t``, and ``usable`` rollouts became
        trainable with it (its whole group, 1 without groups, 0 while its group waits)."""
        if len(self.tokens) == self.tokens.maxlen:
            self._tok -= self.tokens[0]
        self.tokens.append(tokens)
        self._tok += tokens
        if usable > 0:
            if len(self.arrivals) == self.arrivals.maxlen:
                self._usable -= self.arrivals[0][1]
            self.arrivals.append((t, usable))
            self._usable += usable

    def rate(self, t: float) -> float:
        """Rollouts a second that became trainable after the oldest arrival kept, up to
        ``t`` (0 before two arrivals); it falls while none come."""
        if len(self.arrivals) < 2 or t <= self.arrivals[0][0]:
            return 0.0
        return (self._usable - self.arrivals[0][1]) / (t - self.arrivals[0][0])

    @property
    def mean_tokens(self) -> float:
        return self._tok / len(self.tokens) if self.tokens else 0.0
