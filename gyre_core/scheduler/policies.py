"""The three scheduling policies: ``colocate``, ``async`` (fixed split) and ``elastic``.

All three read the same :class:`Snapshot` and admit rollouts under the same staleness
rule (colocate is on-policy: it admits one batch at a time) and the same dispatch
(``scheduler.dispatch``: continuous, or boundary, in bursts, as the paper ran its
baselines: :meth:`Snapshot.admissible_ahead`). Registry: :data:`POLICIES`
(:func:`register_policy`); the config's ``scheduler.policy`` choices are its names. An
entry that also builds its policy over a given split (:class:`FixedSplitFactory`, as
``async``'s does) is one that ``scheduler.rollout_units`` and ``--split`` apply to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gyre_core.cluster import ROLLOUT, TRAIN, async_split
from gyre_core.registry import Registry
from gyre_core.scheduler.base import Decision, Policy, Snapshot, can_train, idle_rollout_units

if TYPE_CHECKING:  # scheduler/config.py takes its policy choices and elastic defaults from here
    from gyre_core.scheduler.config import SchedulerConfig


class Colocate:
    """verl's hybrid engine: the whole cluster generates a step's batch, waits for its
    last rollout, switches every unit to training, trains, switches every unit back (the
    engine reloads the new weights as part of that switch), then starts the next batch.
    Under boundary dispatch with bursts of ``k`` steps it generates ``k`` batches at once
    and trains them one step after another before switching back (the later steps
    off-policy, as the paper's Colocate with multi-step bursts; never past the admission
    bound, as every policy)."""

    name = "colocate"

    def initial_roles(self, units: int) -> list[str]:
        return [ROLLOUT] * units

    def decide(self, s: Snapshot) -> Decision:
        if s.training:
            return Decision()
        all_units = range(s.units)
        if s.active_sessions == 0 and s.ready >= s.rollouts_per_step:  # the batch is done
            if all(r == TRAIN for r in s.roles):
                return Decision(start_step=True)
            return Decision(targets={u: TRAIN for u in all_units if s.targets[u] != TRAIN})
        if any(t != ROLLOUT for t in s.targets):  # a step just ended: back to generation
            return Decision(targets={u: ROLLOUT for u in all_units if s.targets[u] != ROLLOUT})
        if all(r == ROLLOUT for r in s.roles):  # the step's own rollouts (or its burst's)
            return Decision(admit=s.admissible_ahead(s.burst_ahead))
        return Decision()


@dataclass
class Async:
    """A fixed split: ``rollout_units`` engines generate continuously, ``train_units``
    train whenever a batch is ready; the staleness bound limits how far generation runs
    ahead (AReaL, verl's fully-async mode)."""

    rollout_units: int
    train_units: int
    name: str = "async"

    def initial_roles(self, units: int) -> list[str]:
        r, t = self.rollout_units, self.train_units
        if r < 1 or t < 1:
            raise ValueError(f"async: rollout_units {r} and train_units {t}: each needs >= 1")
        if r + t != units:
            raise ValueError(
                f"async: rollout_units {r} + train_units {t} = {r + t} does not add up to "
                f"the cluster's {units} units"
            )
        return [ROLLOUT] * self.rollout_units + [TRAIN] * self.train_units

    def decide(self, s: Snapshot) -> Decision:
        return Decision(admit=s.admissible, start_step=can_train(s))


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
      are not inside a step come back at once, whatever the backlog.
    * **No thrashing.** Otherwise (between steps, or while a step runs on other units),
      units go back to rollout only when the sessions need more engines than rollout
      holds and the next batch is far off (fewer than ``return_below`` of a batch ready),
      never below the base share; a unit inside a running step is never taken (the
      simulator and the runtime both refuse it). A step starts
      once the units still on their way would not pay for their switch (training on
      ``n`` units takes ``tokens / (n * rate)``; waiting ``switch_s`` for more must save
      more than it costs).

    A run sets ``fill``, ``train_share`` and ``return_below`` with the config's
    ``scheduler.elastic_*`` fields (:func:`policy_for`).

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
            keep = max(1, self.min_train, s.min_train)
            for u in free[: max(0, min(overflow, len(train) - keep))]:
                targets[u] = ROLLOUT
        leaving = sum(1 for r in targets.values() if r == ROLLOUT)
        coming = len(train) + sum(1 for r in targets.values() if r == TRAIN) - leaving
        start = can_train(s) and self._worth_starting(s, coming, leaving)
        return Decision(targets=targets, admit=admit, start_step=start)

    def _worth_starting(self, s: Snapshot, coming: int, leaving: int) -> bool:
        now = len(s.ready_units(TRAIN)) - leaving
        if now < max(1, s.min_train):
            return False
        if coming <= now:
            return True
        tokens = s.ready_tokens * s.rollouts_per_step / max(s.ready, 1)
        return tokens / (now * s.train_tok_s) <= s.switch_s + tokens / (coming * s.train_tok_s)


# A policy factory: (units, the run's scheduler section or None for the defaults) -> policy.
PolicyFactory = Callable[[int, "SchedulerConfig | None"], Policy]
POLICIES: Registry[PolicyFactory] = Registry("policy")
register_policy = POLICIES.register


@runtime_checkable
class FixedSplitFactory(Protocol):
    """A registry entry whose policy keeps one split of the units for the whole run: the
    config's ``scheduler.rollout_units`` and ``gyre sim run --split`` apply to it, and
    ``with_split`` builds it over a given split instead of the config's."""

    def __call__(self, units: int, cfg: SchedulerConfig | None, /) -> Policy: ...

    def with_split(self, rollout_units: int, train_units: int) -> Policy: ...


@register_policy("colocate")
def _colocate(units: int, cfg: SchedulerConfig | None) -> Policy:
    return Colocate()


class _AsyncFactory:
    """``async`` over ``scheduler.rollout_units`` (0 = half the cluster), or a given split."""

    def __call__(self, units: int, cfg: SchedulerConfig | None, /) -> Policy:
        return Async(*async_split(units, cfg.rollout_units if cfg else 0))

    def with_split(self, rollout_units: int, train_units: int) -> Policy:
        return Async(rollout_units, train_units)


register_policy("async")(_AsyncFactory())


@register_policy("elastic")
def _elastic(units: int, cfg: SchedulerConfig | None) -> Policy:
    if cfg is None:
        return Elastic()
    return Elastic(
        fill=cfg.elastic_fill,
        train_share=cfg.elastic_train_share,
        return_below=cfg.elastic_return_below,
    )


def fixed_split_policies() -> list[str]:
    """The registered policies that keep one split of the units (:class:`FixedSplitFactory`)."""
    return [name for name, entry in POLICIES.items() if isinstance(entry, FixedSplitFactory)]


def make_policy(name: str, units: int, split: tuple[int, int] | None = None) -> Policy:
    """Policy ``name`` with its defaults; ``split``: the (rollout, train) units of a policy
    that keeps one split (the others ignore it)."""
    factory = POLICIES.lookup(name)
    if split is not None and isinstance(factory, FixedSplitFactory):
        return factory.with_split(*split)
    return factory(units, None)


def policy_for(cfg: SchedulerConfig, units: int) -> Policy:
    """The policy a run's scheduler section configures, over ``units`` (the runtime's, the
    simulator's and calibration's one way from a config to a policy)."""
    return POLICIES.lookup(cfg.policy)(units, cfg)
