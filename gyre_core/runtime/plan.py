"""The plan of a real run: what the driver (:mod:`~gyre_core.runtime.real_job`) and the
control loop (:mod:`~gyre_core.runtime.loop`) need of a validated run config, cut from it
once, in one place.

``RunConfig.from_dict`` checked every field and the rules between fields; the plan checks
nothing again. It derives the values the run uses (rollouts per step, sessions of the whole
run) and groups what each part takes: the loop its bounds and budgets, the trainer its own
section with the staleness bound and the seed (:class:`~gyre_core.train.config.TrainSetup`;
``gyre_core.train`` never sees the rest of the run config).
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config import RunConfig
from gyre_core.train.config import TrainSetup


def train_setup(cfg: RunConfig) -> TrainSetup:
    """What a run's trainer takes from its config: the ``train`` section, the scheduler's
    staleness bound (tokens older than that many versions are not trained) and the seed."""
    return TrainSetup(cfg.train, cfg.scheduler.staleness_bound, cfg.seed)


@dataclass(frozen=True, slots=True)
class RunPlan:
    """A real run's derived values, made once from its validated config (:meth:`of`)."""

    config: RunConfig  # the run's collaborators (sessions, books, units) read their sections
    steps: int  # training steps of the run
    per_step: int  # rollouts a step trains: rollout.tasks_per_step x rollout.group_size
    total: int  # sessions of the whole run: steps x per_step
    units: int  # the run's units (cluster.units)
    staleness: int  # scheduler.staleness_bound: the oldest version a step trains
    admit_staleness: int  # scheduler.admission_staleness: how far ahead sessions start
    max_active: int  # scheduler.max_concurrent_rollouts
    burst_steps: int  # scheduler.dispatch and burst_steps: batches a burst (0: continuous)
    drain_s: float  # scheduler.drain_deadline_s: a rollout unit's drain before it switches
    batch_order: str  # scheduler.batch_order: which ready rollouts a step takes
    switch_mode: str  # scheduler.switch_mode: what a switch does with the unit's calls
    warm_start: bool  # a warm start is configured (warm_start.steps or warm_start.weights)
    train: TrainSetup  # what the trainer takes

    @classmethod
    def of(cls, cfg: RunConfig) -> RunPlan:
        s, per_step = cfg.scheduler, cfg.rollout.tasks_per_step * cfg.rollout.group_size
        return cls(
            config=cfg,
            steps=cfg.steps,
            per_step=per_step,
            total=cfg.steps * per_step,
            units=cfg.cluster.units,
            staleness=s.staleness_bound,
            admit_staleness=s.admission_staleness,
            max_active=s.max_concurrent_rollouts,
            burst_steps=s.bursts,
            drain_s=s.drain_deadline_s,
            batch_order=s.batch_order,
            switch_mode=s.switch_mode,
            warm_start=bool(cfg.warm_start.steps or cfg.warm_start.weights),
            train=train_setup(cfg),
        )

    @property
    def policy(self) -> str:
        """The scheduling policy's name (the run's status messages carry it)."""
        return self.config.policy
