"""The three policies side by side on one trace and one cost table.

:func:`best_split` finds the ``async`` policy's best fixed split of rollout and training
units, so that elastic is compared against async at its best rather than at an arbitrary
split; :func:`compare` runs colocate, async at that split and elastic.

The split search. ``async`` with ``R`` rollout units and ``T = units - R`` training units
has one simulation per candidate ``R`` in ``1..units-1``; on a cluster of hundreds of units
trying them all costs hundreds of full simulations. Instead:

1. evaluate a grid of at most :data:`GRID` splits spread evenly over ``lo..hi`` (at first
   ``1..units-1``, both ends included);
2. take the best split evaluated so far and narrow ``lo..hi`` to its neighbours among the
   splits evaluated (the nearest one below it and the nearest one above it);
3. repeat until every split in ``lo..hi`` has been evaluated.

The split returned is therefore never worse than either split next to it (``R - 1`` and
``R + 1`` were simulated too): a local minimum, and the global one when the makespan is
unimodal in ``R`` (too few rollout units starve the trainer, too few training units leave
batches waiting). Where it is not, the search still returns the best split it evaluated, and
every split it evaluated is reported. Ties go to the split with fewer rollout units.

Each round narrows the interval to about ``2/(GRID-1)`` of its width and reuses the splits
already simulated, so the cost grows with the logarithm of the cluster: all 7 splits of 8
units, at most about 17 simulations for 64 units, 30 for 1,024, 38 for 4,096.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gyre_core.cluster import Cluster
from gyre_core.scheduler.policies import make_policy
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import TraceRollout

GRID = 8  # splits per round of the search (the first round spans the whole cluster)

Progress = Callable[[str], None]
Summary = dict[str, Any]


def _units(costs: CostModel) -> int:
    """The cluster's units, refused (``ClusterError``) the way the simulator refuses them."""
    return len(Cluster(costs.gpus, costs.gpus_per_unit, costs.gpus_per_node))


def split_label(split: tuple[int, int]) -> str:
    return f"{split[0]}:{split[1]}"


def grid(lo: int, hi: int, n: int = GRID) -> list[int]:
    """At most ``n`` distinct integers spread evenly over ``lo..hi``, both ends included."""
    if hi - lo + 1 <= n:
        return list(range(lo, hi + 1))
    return sorted({lo + round(i * (hi - lo) / (n - 1)) for i in range(n)})


def _simulate(
    trace: list[TraceRollout],
    costs: CostModel,
    policy: str,
    mode: str,
    split: tuple[int, int] | None,
    progress: Progress | None,
) -> Summary:
    t0 = time.perf_counter()
    summary = Simulator(trace, costs, make_policy(policy, costs.units, split), mode=mode).run()
    if progress is not None:
        label = policy if split is None else f"{policy} {split_label(split)}"
        progress(
            f"{label:<14} makespan {summary['makespan_s']:>12,.1f} s  "
            f"({time.perf_counter() - t0:.2f} s wall)"
        )
    return summary


def search(units: int, makespan: Callable[[int], float]) -> tuple[int, dict[int, float]]:
    """The search of this module's docstring over ``R`` in ``1..units-1``: the best ``R``
    found and ``makespan(R)`` of every ``R`` evaluated (each evaluated once)."""
    if units < 2:
        raise ValueError(f"a split needs at least 2 units, got {units}")
    seen: dict[int, float] = {}
    lo, hi = 1, units - 1
    while True:
        for r in grid(lo, hi):
            if r not in seen:
                seen[r] = makespan(r)
        best = min(seen, key=lambda k: (seen[k], k))
        lo = max((k for k in seen if k < best), default=best)
        hi = min((k for k in seen if k > best), default=best)
        if all(k in seen for k in range(lo, hi + 1)):
            return best, seen


def best_split(
    trace: list[TraceRollout],
    costs: CostModel,
    mode: str = "migrate",
    *,
    progress: Progress | None = None,
) -> tuple[tuple[int, int], Summary, list[dict[str, Any]]]:
    """The async split ``(rollout_units, train_units)`` with the smallest makespan found by
    the search in this module's docstring, its summary, and every split evaluated as
    ``{"split": "R:T", "makespan_s": ...}`` in order of ``R``."""
    units = _units(costs)
    summaries: dict[int, Summary] = {}  # only the best so far is kept

    def makespan(r: int) -> float:
        summary = _simulate(trace, costs, "async", mode, (r, units - r), progress)
        value = float(summary["makespan_s"])
        best = next(iter(summaries), None)
        if best is None or (value, r) < (float(summaries[best]["makespan_s"]), best):
            summaries.clear()
            summaries[r] = summary
        return value

    r, seen = search(units, makespan)
    evaluated = [
        {"split": split_label((k, units - k)), "makespan_s": seen[k]} for k in sorted(seen)
    ]
    return (r, units - r), summaries[r], evaluated


def compare(
    trace: list[TraceRollout],
    costs: CostModel,
    mode: str = "migrate",
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Colocate, async at its best split and elastic on the same trace and costs.

    ``elastic_vs_colocate`` and ``elastic_vs_async`` are the other policy's makespan over
    elastic's (above 1: elastic is faster), rounded to 4 decimals."""
    _units(costs)  # refuse an impossible cluster before the first simulation
    colocate = _simulate(trace, costs, "colocate", mode, None, progress)
    split, async_summary, evaluated = best_split(trace, costs, mode, progress=progress)
    elastic = _simulate(trace, costs, "elastic", mode, None, progress)
    return {
        "colocate": colocate,
        "async": {**async_summary, "split": split_label(split)},
        "elastic": elastic,
        "async_splits": evaluated,
        "elastic_vs_colocate": _ratio(colocate, elastic),
        "elastic_vs_async": _ratio(async_summary, elastic),
    }


def _ratio(other: Summary, elastic: Summary) -> float:
    e = float(elastic["makespan_s"])
    return round(float(other["makespan_s"]) / e, 4) if e > 0 else 0.0


__all__ = ["GRID", "best_split", "compare", "grid", "search", "split_label"]
