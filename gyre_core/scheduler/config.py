"""The run's ``scheduler`` section: which policy shares the units between rollout and
training, and its knobs (choices and elastic defaults come from :mod:`.policies`)."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field
from gyre_core.scheduler.policies import POLICIES, Elastic


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: str = config_field("elastic", "how units share rollout and training", choices=POLICIES)
    rollout_units: int = config_field(
        0, "async only: fixed rollout units (0 = half the cluster)", min=0
    )
    staleness_bound: int = config_field(2, "train on tokens at most this many versions old", min=0)
    admission_staleness: int = config_field(
        -1,
        "start a rollout at most this many versions ahead of the policy (-1 = the staleness "
        "bound); further ahead than the bound, its oldest tokens are masked",
        min=-1,
    )
    max_concurrent_rollouts: int = config_field(
        0, "every policy: the most rollouts running at once (0 = no cap)", min=0
    )
    dispatch: str = config_field(
        "continuous",
        "every policy: 'continuous' starts a rollout whenever admission allows; "
        "'boundary' releases them in bursts of burst_steps batches, the next burst once "
        "every rollout of the last has ended and admission allows all of it (the paper's "
        "baselines)",
        choices=("continuous", "boundary"),
    )
    burst_steps: int = config_field(
        1, "boundary dispatch only: a burst is this many steps' batches", min=1, max=64
    )
    streaming: bool = config_field(
        False,
        "train in streaming steps (the paper's cells): a step opens on the first whole "
        "group ready and takes the rest as they finish; the first unit holds the optimizer "
        "state, the others weights only; every training unit claims micro-steps, and one "
        "that enters training while a step runs joins it (needs cluster.gpus_per_unit 1)",
    )
    switch_mode: str = config_field(
        "migrate",
        "how a unit leaves rollout: keep tokens or restart",
        choices=("migrate", "restart"),
    )
    drain_deadline_s: float = config_field(
        2.0, "in-flight calls may finish this long before moving", min=0.0
    )
    batch_order: str = config_field(
        "arrival",
        "which finished rollouts a step trains: 'arrival' = whole GRPO groups as they "
        "complete, the oldest policy version first (a group whose tokens are all past "
        "staleness_bound is dropped and counted; with group_size 1, the first rollouts to "
        "finish); 'index' = the step's own tasks, as colocate would (waits for its "
        "slowest; runs repeat closer)",
        choices=("arrival", "index"),
    )

    @property
    def bursts(self) -> int:
        """The policies' ``Snapshot.burst_steps``: 0 under continuous dispatch."""
        return self.burst_steps if self.dispatch == "boundary" else 0

    # Elastic's knobs; their defaults are Elastic's own (docs/sim-results.md).
    elastic_fill: float = config_field(
        Elastic.fill,
        "elastic only: share of an engine's sequence cap the sessions are sized for (more "
        "packs them onto fewer engines and trains on the rest)",
        min=0.05,
        max=1.0,
    )
    elastic_train_share: float = config_field(
        Elastic.train_share,
        "elastic only: share of the units that train whenever a batch is ready (at least "
        "one unit trains and one serves)",
        min=0.0,
        max=1.0,
    )
    elastic_return_below: float = config_field(
        Elastic.return_below,
        "elastic only: training units beyond that share go back to rollout while less than "
        "this share of a batch is ready",
        min=0.0,
        max=1.0,
    )
