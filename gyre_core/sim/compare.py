"""The three policies side by side on one trace and one cost table, by the work they do.

A run's headline is its **goodput**, tokens trained per second (``goodput_tok_s``; tokens
masked as too old count as context, not as trained): a policy that finishes sooner because
more of its rollouts timed out, or masks more, trained less, and makespan alone would reward
it. Timeouts and tokens trained are reported beside makespan.

:func:`best_split` finds the ``async`` policy's best fixed split of rollout and training
units, so that elastic is compared against async at its best rather than at an arbitrary
split: the best goodput among the splits whose timeouts exceed the fewest any split had by
at most :data:`TIMEOUT_SLACK` of the rollouts (a split may not buy goodput by dropping
rollouts). :func:`compare` runs colocate, async at that split and elastic.

The split search. ``async`` with ``R`` rollout units and ``T = units - R`` training units
has one simulation per candidate ``R`` in ``1..units-1``; on a cluster of hundreds of units
trying them all costs hundreds of full simulations. Instead:

1. evaluate a grid of at most :data:`GRID` splits spread evenly over ``lo..hi`` (at first
   ``1..units-1``, both ends included);
2. take the best split evaluated so far and narrow ``lo..hi`` to its neighbours among the
   splits evaluated (the nearest one below it and the nearest one above it);
3. repeat until every split in ``lo..hi`` has been evaluated.

The split returned is therefore never worse than either split next to it (``R - 1`` and
``R + 1`` were simulated too): a local optimum, and the global one when the score is
unimodal in ``R`` (too few rollout units starve the trainer, too few training units leave
batches waiting). Where it is not, the search still returns the best split it evaluated, and
every split it evaluated is reported. Ties go to the split with fewer rollout units.

Each round narrows the interval to about ``2/(GRID-1)`` of its width and reuses the splits
already simulated, so the cost grows with the logarithm of the cluster: all 7 splits of 8
units, at most about 17 simulations for 64 units, 30 for 1,024, 38 for 4,096.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from gyre_core.cluster import Cluster
from gyre_core.scheduler.policies import make_policy
from gyre_core.sim.costs import CostModel
from gyre_core.sim.regime import regime
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import TraceRollout

GRID = 8  # splits per round of the search (the first round spans the whole cluster)
TIMEOUT_SLACK = 0.01  # best_split: timeouts above the fewest allowed, as a share of rollouts

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
    batch_order: str = "arrival",
) -> Summary:
    t0 = time.perf_counter()
    pol = make_policy(policy, costs.units, split)
    summary = Simulator(trace, costs, pol, mode=mode, batch_order=batch_order).run()
    if progress is not None:
        label = policy if split is None else f"{policy} {split_label(split)}"
        progress(
            f"{label:<14} makespan {summary['makespan_s']:>12,.1f} s  "
            f"goodput {summary['goodput_tok_s']:>10,.1f} tok/s  "
            f"timeouts {summary['timeouts']}  ({time.perf_counter() - t0:.2f} s wall)"
        )
    return summary


def search(
    units: int,
    evaluate: Callable[[int], Any],
    best_of: Callable[[dict[int, Any]], int] | None = None,
    min_train: int = 1,
) -> tuple[int, dict[int, Any]]:
    """The search of this module's docstring over ``R`` in ``1..units-min_train``: the best
    ``R`` found and ``evaluate(R)`` of every ``R`` evaluated (each evaluated once).
    ``best_of`` picks the best ``R`` among those evaluated so far; by default the smallest
    value, ties to the smaller ``R``."""
    if units < 1 + min_train:
        raise ValueError(
            f"a split needs at least {1 + min_train} units "
            f"(1 for rollout, {min_train} for training), got {units}"
        )
    pick = best_of or (lambda seen: min(seen, key=lambda k: (seen[k], k)))
    seen: dict[int, Any] = {}
    lo, hi = 1, units - min_train
    while True:
        for r in grid(lo, hi):
            if r not in seen:
                seen[r] = evaluate(r)
        best = pick(seen)
        lo = max((k for k in seen if k < best), default=best)
        hi = min((k for k in seen if k > best), default=best)
        if all(k in seen for k in range(lo, hi + 1)):
            return best, seen


def best_by_goodput(seen: dict[int, Summary], rollouts: int) -> int:
    """The split of the best goodput among those whose timeouts exceed the fewest seen by
    at most :data:`TIMEOUT_SLACK` of ``rollouts``; ties to fewer rollout units."""
    fewest = min(int(s["timeouts"]) for s in seen.values())
    allowed = fewest + TIMEOUT_SLACK * rollouts
    eligible = [r for r, s in seen.items() if s["timeouts"] <= allowed]
    return min(eligible, key=lambda r: (-float(seen[r]["goodput_tok_s"]), r))


def best_split(
    trace: list[TraceRollout],
    costs: CostModel,
    mode: str = "migrate",
    *,
    progress: Progress | None = None,
    batch_order: str = "arrival",
) -> tuple[tuple[int, int], Summary, list[dict[str, Any]]]:
    """The async split ``(rollout_units, train_units)`` the search in this module's
    docstring finds (:func:`best_by_goodput`), its summary, and every split evaluated as
    ``{"split": "R:T", "makespan_s", "goodput_tok_s", "timeouts", "tokens_trained"}`` in
    order of ``R``."""
    units = _units(costs)

    def evaluate(r: int) -> Summary:
        return _simulate(trace, costs, "async", mode, (r, units - r), progress, batch_order)

    pick = functools.partial(best_by_goodput, rollouts=len(trace))
    r, seen = search(units, evaluate, pick, min_train=costs.min_train_units)
    keys = ("makespan_s", "goodput_tok_s", "timeouts", "tokens_trained")
    evaluated = [
        {"split": split_label((k, units - k)), **{x: seen[k][x] for x in keys}}
        for k in sorted(seen)
    ]
    return (r, units - r), seen[r], evaluated


def compare(
    trace: list[TraceRollout],
    costs: CostModel,
    mode: str = "migrate",
    *,
    progress: Progress | None = None,
    batch_order: str = "arrival",
) -> dict[str, Any]:
    """Colocate, async at its best split and elastic on the same trace and costs, each
    step training by ``batch_order`` (``index``: every policy trains the same rollouts in
    the same steps).

    ``elastic_vs_colocate`` and ``elastic_vs_async`` are elastic's goodput over the other
    policy's (above 1: elastic trains more tokens a second); ``makespan_vs_colocate`` and
    ``makespan_vs_async`` the other's makespan over elastic's (above 1: elastic is done
    sooner). Each rounded to 4 decimals."""
    _units(costs)  # refuse an impossible cluster before the first simulation
    colocate = _simulate(trace, costs, "colocate", mode, None, progress, batch_order)
    split, async_summary, evaluated = best_split(
        trace, costs, mode, progress=progress, batch_order=batch_order
    )
    elastic = _simulate(trace, costs, "elastic", mode, None, progress, batch_order)
    q1 = first_quarter_split(trace, costs, mode, batch_order=batch_order)
    if q1 == split:
        early = async_summary
    else:
        early = _simulate(trace, costs, "async", mode, q1, progress, batch_order)
    ceiling = float(elastic["ceiling_goodput_tok_s"])
    return {
        "colocate": colocate,
        "async": {**async_summary, "split": split_label(split)},
        "elastic": elastic,
        "async_splits": evaluated,
        "batch_order": batch_order,
        "elastic_vs_colocate": _ratio(elastic["goodput_tok_s"], colocate["goodput_tok_s"]),
        "elastic_vs_async": _ratio(elastic["goodput_tok_s"], async_summary["goodput_tok_s"]),
        "makespan_vs_colocate": _ratio(colocate["makespan_s"], elastic["makespan_s"]),
        "makespan_vs_async": _ratio(async_summary["makespan_s"], elastic["makespan_s"]),
        # async at the split that was best on the first quarter of the trace (what a user
        # who tuned the split on an early part of the run would keep)
        "async_first_quarter": {**early, "split": split_label(q1)},
        "elastic_vs_async_first_quarter": _ratio(elastic["goodput_tok_s"], early["goodput_tok_s"]),
        # the policy-independent bound's goodput (the most any policy trains a second)
        # over async's: no policy can beat the best split by more
        "ceiling_goodput_tok_s": ceiling,
        "ceiling_vs_async": _ratio(ceiling, async_summary["goodput_tok_s"]),
        # the regime the trace and costs are in (sim/regime.py)
        "regime": regime(trace, costs),
    }


def first_quarter_split(
    trace: list[TraceRollout], costs: CostModel, mode: str = "migrate", *, batch_order: str
) -> tuple[int, int]:
    """The async split :func:`best_split` picks on the first quarter of ``trace`` (at least
    one step's rollouts)."""
    b = costs.rollouts_per_step
    head = trace[: max(b, len(trace) // 4 // b * b)]
    split, _, _ = best_split(head, costs, mode, batch_order=batch_order)
    return split


def _ratio(a: Any, b: Any) -> float:
    return round(float(a) / float(b), 4) if float(b) > 0 else 0.0


__all__ = [
    "GRID",
    "TIMEOUT_SLACK",
    "best_by_goodput",
    "best_split",
    "compare",
    "first_quarter_split",
    "grid",
    "search",
    "split_label",
]
