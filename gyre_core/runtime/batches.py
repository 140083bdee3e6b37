"""What the run loop's batching (batching.py) reads of its finished rollouts: a
rollout's index, its group (``index // rollout.group_size``) and the versions of its
tokens."""

from __future__ import annotations

from gyre_core.runtime.plan import RunPlan
from gyre_core.scheduler import batching
from gyre_core.trajectory.format import Rollout


def rollout_index(r: Rollout) -> int:
    """The session index a run's rollout was started with (its id is ``r<index>``)."""
    return int(r.rollout_id[1:])


def span(r: Rollout) -> batching.Span:
    """The oldest and newest policy version of ``r``'s decoded tokens (None: it has none).
    Every token records its version, a resumed run's ready rollouts' included, so this is
    what groups are ranked by (the version a session was admitted at is not recorded)."""
    ends = [v for c in r.calls if len(c.versions) for v in (c.versions.min(), c.versions.max())]
    return (int(min(ends)), int(max(ends))) if ends else None


def select(ready: list[Rollout], plan: RunPlan, version: int) -> batching.Selection:
    """Which of ``ready`` the steps from ``version`` on train, in order, and which are
    complete groups past the staleness bound (batching.py)."""
    groups = batching.NO_GROUPS  # only whole-group arrival reads the versions
    if grouped(plan):
        spans = [span(r) for r in ready]
        groups = batching.Groups(plan.config.rollout.group_size, spans, plan.staleness)
    indices = [rollout_index(r) for r in ready]
    return batching.select(indices, plan.per_step, version, plan.batch_order, groups)


def grouped(plan: RunPlan) -> bool:
    """Whether ``arrival`` takes whole groups (and counts the stale ones it drops)."""
    return plan.batch_order == batching.ARRIVAL and plan.config.rollout.group_size > 1
