"""``elastic``: the policy that moves units both ways as demand shifts (registered in
:mod:`gyre_core.scheduler.policies` with the other two)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gyre_core.cluster import ROLLOUT, SWITCHING, TRAIN
from gyre_core.scheduler.base import Decision, Snapshot, can_train, idle_rollout_units


@dataclass
class Elastic:
    """Moves units both ways as demand shifts.

    * **A base training share** of ``train_share`` of the units, taken when a batch is
      ready (units come from rollout only then, so the first batch is gathered on every
      unit).
    * **Idle engines train.** When a batch is ready, no step runs and admission is
      closed, every rollout unit beyond what the sessions need moves to training too,
      lightest-loaded first (fewest prefix caches lost); in-flight calls migrate with
      their tokens. The sessions counted are the live ones plus those the batches
      already waiting will admit when their steps publish (``ceil(sessions / (fill *
      max_seqs_per_unit))`` engines, at least ``min_rollout``): harvesting engines that
      the next step's admissions need starves those rollouts while the backlog trains.
    * **No queueing.** A session waiting for an engine slot makes no progress at all, so
      when the live sessions overflow the engines' sequence caps, training units that
      are not inside a step come back at once, whatever the backlog, down to the units
      that hold the training state (``Snapshot.min_train``).
    * **Lending the trainer** (``lend``). Between steps (none running, the next batch not
      ready) those units too serve rollouts, while the sessions beyond the engines' caps
      fill whole units (one unit per ``max_seqs_per_unit`` sessions; a part of a unit's
      worth is not lent) and the time until the next batch pays for it: the next batch
      is predicted ready in ``eta = (rollouts_per_step - ready) / finish_rate`` seconds
      (``finish_rate``: rollouts becoming trainable a second lately, whole groups); a lent unit serves ``eta`` less a switch each way and the
      drain, and must serve longer than the engine time its sessions spend re-prefilling
      their contexts (``2 * max_seqs_per_unit * mean_rollout_tokens / 2 / prefill_tok_s``:
      the sessions it takes on and those it hands back, each at half a finished
      rollout's tokens). Lent units come back (*recall*), least loaded first:
      all of them at once when ``eta`` falls to a switch plus the drain, so that the
      state is whole when the batch is; before that, one at a time (the next only once
      the last is in place) while the outstanding sessions fit the other engines at the
      policy's own sizing (``fill``; the waterlevel ``w <= C_R - C_e``, with the margin
      ``C_e`` the engines' unfilled share). Without a finish rate (``finish_rate`` 0:
      no two arrivals yet) nothing is lent.
    * **No thrashing.** Otherwise (between steps, or while a step runs on other units),
      units go back to rollout only when the sessions need more engines than rollout
      holds and the next batch is far off (fewer than ``return_below`` of a batch ready),
      never below the base share; a unit inside a running step is never taken (the
      simulator and the runtime both refuse it). A step starts
      once the units still on their way would not pay for their switch (training on
      ``n`` units takes ``tokens / (n * rate)``; waiting ``switch_s`` for more must save
      more than it costs).

    A run sets ``fill``, ``train_share`` and ``return_below`` with the config's
    ``scheduler.elastic_*`` fields (``policies.policy_for``).

    Tried and dropped (docs/sim-results.md): learning the share online from step timing
    and backlog (on waves of rollouts that finish together it overshot); returning units
    below the base share; packing engines fuller (``fill`` 0.75 or 1).
    """

    min_rollout: int = 1
    min_train: int = 0
    return_below: float = 0.5
    # Engines are sized for a quarter of their sequence cap: sessions spread over more
    # engines decode faster, and fewer units are harvested for a step and sent back
    # after it (each move re-prefills the sessions it displaces). Of 0.2 to 1, 0.25 kept
    # elastic closest to the best fixed split over the benchmark rows
    # (docs/sim-results.md); fuller sizings trailed it at 256 GPUs.
    fill: float = 0.25
    train_share: float = 0.5
    start_split: bool = True
    lend: bool = True  # lend the units holding the training state between steps
    name: str = "elastic"

    def initial_roles(self, units: int) -> list[str]:
        if self.min_rollout < 1 or self.min_rollout + max(self.min_train, 1) > units:
            raise ValueError(
                f"elastic: min_rollout={self.min_rollout}, min_train={self.min_train} "
                f"do not fit {units} units"
            )
        share = max(self.min_train, int(units * self.train_share))
        n_train = min(units - self.min_rollout, share) if self.start_split else self.min_train
        return [TRAIN] * n_train + [ROLLOUT] * (units - n_train)

    def _engines(self, s: Snapshot, sessions: int) -> int:
        return max(self.min_rollout, math.ceil(sessions / (s.max_seqs_per_unit * self.fill)))

    def decide(self, s: Snapshot) -> Decision:
        b = s.rollouts_per_step
        top = s.units - self.min_rollout
        # never fewer than the training state needs (the memory model's floor)
        base = max(1, s.min_train, min(top, int(s.units * self.train_share)))
        admit = s.admissible
        sessions = s.active_sessions + admit
        need = self._engines(s, sessions)
        rollout = [u for u in range(s.units) if s.targets[u] == ROLLOUT]
        train = [u for u in range(s.units) if s.targets[u] == TRAIN]
        targets: dict[int, str] = {}
        if s.ready >= b and not s.training:
            # Harvest just before a step, and only while admission is closed (the
            # staleness bound or the end of the trace): sessions can then only dwindle
            # until the step publishes. A unit taken while a step runs would wait idle
            # for the next one; meanwhile units that no step uses may go back.
            soon = min(s.remaining, (s.ready // b) * b)
            harvest = s.units - self._engines(s, sessions + soon) if admit == 0 else 0
            want = min(top, max(base, harvest))
            movable = [u for u in idle_rollout_units(s) if s.targets[u] == ROLLOUT]
            for u in movable[: max(0, want - len(train))]:
                targets[u] = TRAIN
        elif s.ready < self.return_below * b and need > len(rollout):
            extra = [u for u in train if s.roles[u] == TRAIN][max(base, self.min_train) :]
            for u in extra[: need - len(rollout)]:
                targets[u] = ROLLOUT
        if not targets and not s.training and s.ready < b:
            overflow = math.ceil(sessions / s.max_seqs_per_unit) - len(rollout)
            free = [u for u in train if s.roles[u] == TRAIN]
            n = max(0, min(overflow, len(train) - self._floor(s)))
            if self.lend and self._lending_pays(s):
                # whole units' worth of sessions beyond the engines, floor units included
                n = max(n, (sessions - len(rollout) * s.max_seqs_per_unit) // s.max_seqs_per_unit)
            for u in free[:n]:
                targets[u] = ROLLOUT
            if not targets:
                targets = self._recall(s, sessions, len(rollout), len(train))
        leaving = sum(1 for r in targets.values() if r == ROLLOUT)
        coming = len(train) + sum(1 for r in targets.values() if r == TRAIN) - leaving
        start = can_train(s) and self._worth_starting(s, coming, leaving)
        return Decision(targets=targets, admit=admit, start_step=start)

    def _floor(self, s: Snapshot) -> int:
        """The training units a step needs: those that hold the training state."""
        return max(1, self.min_train, s.min_train)

    def _eta(self, s: Snapshot) -> float | None:
        """Seconds until the next batch is predicted ready (None: no finish rate)."""
        if s.finish_rate <= 0:
            return None
        return max(0, s.rollouts_per_step - s.ready) / s.finish_rate

    def _lending_pays(self, s: Snapshot) -> bool:
        """A unit lent now serves longer than its sessions' re-prefills cost (class doc)."""
        eta = self._eta(s)
        if eta is None or s.version == 0:  # what is lent before a step is not recalled
            return False
        serve = eta - 2 * s.switch_s - s.drain_s  # out, back, and the drain before it
        reprefill = 0.0
        if s.prefill_tok_s > 0:
            reprefill = s.max_seqs_per_unit * s.mean_rollout_tokens / s.prefill_tok_s
        return serve > reprefill

    def _recall(self, s: Snapshot, sessions: int, rollout: int, train: int) -> dict[int, str]:
        """Lent units back to training: all when the next batch is due, else one at a time
        while the outstanding sessions fit the other engines (the waterlevel)."""
        short = self._floor(s) - train
        if short <= 0:
            return {}
        movable = [u for u in idle_rollout_units(s) if s.targets[u] == ROLLOUT]
        movable = movable[: max(0, rollout - self.min_rollout)]
        eta = self._eta(s)
        if eta is None or s.version == 0:
            # Before the first step, a unit short of the floor may be one never taken (the
            # initial share); the harvest brings those when the batch is ready.
            return {}
        if eta <= s.switch_s + s.drain_s:
            return {u: TRAIN for u in movable[:short]}
        arriving = any(s.roles[u] == SWITCHING and s.targets[u] == TRAIN for u in range(s.units))
        if not arriving and self._engines(s, sessions) < rollout:
            return {u: TRAIN for u in movable[:1]}
        return {}

    def _worth_starting(self, s: Snapshot, coming: int, leaving: int) -> bool:
        now = len(s.ready_units(TRAIN)) - leaving
        if now < max(1, s.min_train):
            return False
        if coming <= now:
            return True
        tokens = s.ready_tokens * s.rollouts_per_step / max(s.ready, 1)
        return tokens / (now * s.train_tok_s) <= s.switch_s + tokens / (coming * s.train_tok_s)
