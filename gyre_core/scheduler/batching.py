"""Which finished rollouts a training step takes: shared by the simulator and the runtime.

* ``arrival`` (the default): the first ``per_step`` rollouts to finish, whatever step
  admitted them — a step never waits for a straggler while others are done (AReaL's and
  verl's fully-async trainers batch this way).
* ``index``: step ``k`` trains exactly rollouts ``k*per_step .. (k+1)*per_step - 1``, the
  tasks, groups and sampling seeds colocate would give it, and waits for the slowest of
  them. Two runs then differ only in which policy version produced each token, so async
  and elastic runs repeat far closer (docs/learning.md).

Both orders train every rollout exactly once; only the grouping into steps differs.
"""

from __future__ import annotations

from collections.abc import Sequence

ARRIVAL, INDEX = "arrival", "index"
ORDERS = (ARRIVAL, INDEX)


def usable(ready: Sequence[int], per_step: int, step: int, order: str) -> list[int]:
    """Positions in ``ready`` (rollout indices, in finish order) in the order steps will
    train them, from step ``step`` (the number of steps already taken) on.

    Under ``arrival`` that is all of them, as they finished. Under ``index`` it is the
    ready members of step ``step``'s batch, then, only if that batch is complete, those of
    the next, and so on: ``len(result) >= per_step`` exactly when the next step can start,
    and its first ``per_step`` entries are that step's batch.
    """
    if order == ARRIVAL:
        return list(range(len(ready)))
    if order != INDEX:
        raise ValueError(f"batch order must be one of {', '.join(ORDERS)}, got {order!r}")
    by_step: dict[int, list[int]] = {}
    for pos, idx in enumerate(ready):
        by_step.setdefault(idx // per_step, []).append(pos)
    out: list[int] = []
    k = step
    while members := sorted(by_step.get(k, []), key=lambda p: ready[p]):
        out += members
        if len(members) < per_step:
            break
        k += 1
    return out


def take(ready: Sequence[int], per_step: int, step: int, order: str) -> list[int] | None:
    """Positions in ``ready`` of the next step's batch, or None while it is incomplete."""
    order_ = usable(ready, per_step, step, order)
    return order_[:per_step] if len(order_) >= per_step else None
