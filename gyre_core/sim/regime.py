"""Which regime a trace and a cost table are in, before any policy runs: the diagnostics
``gyre sim compare`` prints beside its table (``docs/sim-results.md`` reads its rows by
them).

* **training over rollout work**: the unit-seconds the trace's tokens take to train
  (``train_tok_s``) over those its rollouts take to decode and prefill at the engines'
  best throughput (as the bound counts them, ``bound.reached``). Above 1 the trainer is
  the larger half of the work.
* **the balanced split**: the training units that would make both sides take equally long,
  ``units * train / (train + rollout)``, beside the **floor** the training state needs
  (``min_train_units``): a floor above the balanced split pins units to training that a
  policy which never lends them leaves idle between steps.
* **live rollouts against slots**: the most rollouts admission lets run at once (the
  admission window, ``(ahead + 1)`` batches, or the cap on running rollouts) against the
  engines' sequence slots (``units * max_seqs_per_unit``): far below 1, engines run
  light and a rollout's speed, not the cluster's throughput, sets the pace.
* **the admission choice**: how far ahead rollouts start, the dispatch (continuous or in
  bursts) and whether steps stream, since every table depends on them.
"""

from __future__ import annotations

from typing import Any

from gyre_core.sim.bound import reached
from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout


def regime(trace: list[TraceRollout], c: CostModel) -> dict[str, Any]:
    steps = len(trace) // c.rollouts_per_step
    parts = [reached(r, c) for r in trace[: steps * c.rollouts_per_step]]
    rollout_s = sum(u for _, u in parts)
    train_s = sum(n for n, _ in parts) / c.train_tok_s
    units = c.units
    balanced = units * train_s / (train_s + rollout_s) if train_s + rollout_s > 0 else 0.0
    window = (c.admission_ahead + 1) * c.rollouts_per_step
    if c.max_concurrent > 0:
        window = min(window, c.max_concurrent)
    slots = units * c.max_seqs_per_unit
    return {
        "train_over_rollout": round(train_s / rollout_s, 4) if rollout_s > 0 else 0.0,
        "balanced_train_units": round(balanced, 2),
        "floor_train_units": c.min_train_units,
        "units": units,
        "live_rollouts": window,
        "slots": slots,
        "live_over_slots": round(window / slots, 4),
        "admission_ahead": c.admission_ahead,
        "burst_steps": c.burst_steps,
        "streaming": bool(c.streaming),
    }


def describe(r: dict[str, Any]) -> str:
    """One line of :func:`regime`'s figures."""
    dispatch = (
        f"boundary dispatch, bursts of {r['burst_steps']} steps"
        if r["burst_steps"]
        else "continuous dispatch"
    )
    return (
        f"training work / rollout work {r['train_over_rollout']:.2f}; balanced split "
        f"{r['balanced_train_units']:.1f} of {r['units']} units training, floor "
        f"{r['floor_train_units']}; live rollouts up to {r['live_rollouts']:,} against "
        f"{r['slots']:,} engine slots ({r['live_over_slots']:.2f}); admission "
        f"{r['admission_ahead']} versions ahead, {dispatch}, "
        f"{'streaming' if r['streaming'] else 'whole-batch'} steps"
    )
