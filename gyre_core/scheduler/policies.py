"""The three scheduling policies: ``colocate``, ``async`` (fixed split) and ``elastic``.

All three read the same :class:`Snapshot` and admit rollouts under the same staleness
rule (colocate is on-policy: it admits one batch at a time) and the same dispatch
(``scheduler.dispatch``: continuous, or boundary, in bursts, as the paper ran its
baselines: :meth:`Snapshot.admissible_ahead`). Registry: :data:`POLICIES`
(:func:`register_policy`); the config's ``scheduler.policy`` choices are its names. An
entry that also builds its policy over a given split (:class:`FixedSplitFactory`, as
``async``'s does) is one that ``scheduler.rollout_units`` and ``--split`` apply to.
``elastic`` lives in :mod:`gyre_core.scheduler.elastic`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gyre_core.cluster import ROLLOUT, TRAIN, async_split
from gyre_core.registry import Registry
from gyre_core.scheduler.base import Decision, Policy, Snapshot, can_train
from gyre_core.scheduler.elastic import Elastic as Elastic  # registered below

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
