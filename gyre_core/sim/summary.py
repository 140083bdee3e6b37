"""A simulated run's results: what ``Simulator.run`` returns and ``gyre sim`` prints."""

from __future__ import annotations

from typing import Any

from gyre_core.sim.bound import lower_bound, trace_bound
from gyre_core.sim.costs import CostModel
from gyre_core.sim.session import Session, Stats
from gyre_core.sim.switch import Switches
from gyre_core.sim.workload import TraceRollout


def summarize(
    *,
    policy: str,
    mode: str,
    trace: list[TraceRollout],
    costs: CostModel,
    sessions: list[Session],
    stats: Stats,
    switches: Switches,
    makespan: float,
    steps: int,
    units: int,
) -> dict[str, Any]:
    """The makespan, goodput and the bounds' figures, token and switch counts and the
    GPU-seconds by role of a finished simulation."""
    good = stats.tokens_trained - stats.tokens_masked
    goodput = good / makespan if makespan else 0.0
    hist = dict(sorted(stats.staleness.items()))
    return {
        "policy": policy,
        "switch_mode": mode,
        "makespan_s": round(makespan, 3),
        "steps": steps,
        "rollouts": len(trace),
        "tokens_trained": stats.tokens_trained,
        # the headline of a comparison: tokens trained per second of the run, the masked
        # ones (too old: context only, no gradient) left out
        "goodput_tok_s": round(goodput, 3),
        "tokens_masked": stats.tokens_masked,
        "staleness_histogram": {str(k): v for k, v in hist.items()},
        "max_staleness_trained": max((k for k in hist if k <= costs.staleness), default=0),
        **bound_figures(trace, costs, sessions, stats, makespan, goodput),
        "gpu_seconds_by_role": {k: round(v, 3) for k, v in switches.gpu_s.items()},
        "train_busy_gpu_s": round(switches.train_busy_s, 3),
        "sessions_restarted": stats.sessions_restarted,
        "calls_migrated": stats.calls_migrated,
        "tokens_reprefilled": stats.tokens_reprefilled,
        "tokens_prefilled": stats.tokens_prefilled,
        "tokens_discarded": stats.tokens_discarded,
        "role_switches": switches.count,
        "timeouts": stats.timeouts,
        "peak_rollouts": stats.peak_rollouts,
        "events": stats.events,
        "units": units,
        "gpus": costs.gpus,
    }


def bound_figures(
    trace: list[TraceRollout],
    costs: CostModel,
    sessions: list[Session],
    stats: Stats,
    makespan: float,
    goodput: float,
) -> dict[str, Any]:
    """The policy-independent bound (the trace and the costs alone) and its terms;
    efficiency: this run's goodput over the bound's (the most any policy trains, over the
    bound); the per-run bound (counts this run's own work): a diagnostic."""
    decoded = sum(sum(s.versions.values()) for s in sessions) + stats.tokens_discarded
    bound = lower_bound(
        trace,
        costs,
        decoded=decoded,
        prefilled=stats.tokens_prefilled,
        step_tokens=stats.step_tokens,
    )
    pib = trace_bound(trace, costs)
    ceiling = pib["tokens"] / pib["bound_s"] if pib["bound_s"] else 0.0
    return {
        "lower_bound_s": round(pib["bound_s"], 3),
        "bound_terms_s": {k: round(v, 3) for k, v in pib.items() if k not in ("bound_s", "tokens")},
        "ceiling_goodput_tok_s": round(ceiling, 3),
        "efficiency": round(goodput / ceiling, 4) if ceiling else 0.0,
        "run_bound_s": round(bound, 3),
        "run_efficiency": round(bound / makespan, 4) if makespan else 0.0,
    }
