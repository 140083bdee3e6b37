"""Where a simulated run's time goes, step by step: which chain of waits sets the makespan.

For each training step ``k`` and its batch, rollouts ``(k-1)B .. kB-1`` (exactly what the
step trains under ``--batch-order index``; under ``arrival``, the simulator's default and
sim_bench.py's, what was admitted for it), it prints when that batch's rollouts were
admitted and when its last one finished, the batch's slowest latency, when the step could start at the earliest
(``max(P_{k-1}, batch done)``), how long from there to its publication ``P_k``, and whether
the step waited for its batch (*critical*: the batch finished after ``P_{k-1}``) or for the
previous step. Then a summary: the period per step, the critical steps' batch latency and
step span, the training units' idle GPU-hours (train role, outside a step), and what the
run's own busy GPU-seconds would take spread over every GPU (a figure for the cycle, not a
bound: it keeps the run's own engine density).

    .venv/bin/python benchmarks/sim_timeline.py --kind uniform --gpus 64 --policy elastic
    .venv/bin/python benchmarks/sim_timeline.py --kind uniform --gpus 64 --policy async --split 4:4

Nothing is asserted; figures are the simulator's (deterministic).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core import events as ev
from gyre_core.cli.sim import parse_split
from gyre_core.scheduler import batching
from gyre_core.scheduler.policies import make_policy
from gyre_core.sim.bound import rollout_path
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import KINDS, Kind, generate


def timeline(kind: Kind, gpus: int, rps: int, steps: int, policy: str,
             split: tuple[int, int] | None, seed: int, order: str) -> dict[str, Any]:  # fmt: skip
    costs = CostModel(gpus=gpus, rollouts_per_step=rps)
    trace = generate(kind, steps * rps, seed)
    sink = ev.ListSink()
    sim = Simulator(trace, costs, make_policy(policy, costs.units, split),
                    batch_order=order, sink=sink)  # fmt: skip
    summary = sim.run()
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    published = [0.0]
    for e in sink.events:
        if isinstance(e, ev.RolloutStarted):
            started[e.rollout_id] = e.t
        elif isinstance(e, ev.RolloutFinished):
            finished[e.rollout_id] = e.t
        elif isinstance(e, ev.StepFinished):
            published.append(e.t)
    rows = []
    for k in range(1, len(published)):
        batch = trace[(k - 1) * rps : k * rps]
        ids = [r.rollout_id for r in batch]
        admitted = min(started[i] for i in ids)
        done = max(finished[i] for i in ids)
        latency = max(finished[i] - started[i] for i in ids)
        alone = max(rollout_path(r, costs) for r in batch)
        syncs = sum(1 for t in published[1:] if admitted < t < done)
        earliest = max(published[k - 1], done)
        rows.append({"step": k, "admitted": admitted, "done": done, "latency": latency,
                     "alone": alone, "syncs": syncs,
                     "earliest": earliest, "span": published[k] - earliest,
                     "published": published[k], "critical": done > published[k - 1]})  # fmt: skip
    return {"summary": summary, "rows": rows, "costs": costs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=KINDS, default="uniform")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--rollouts-per-step", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--policy", default="elastic")
    p.add_argument("--split", default=None, help="R:T for --policy async")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-order",
        choices=batching.ORDERS,
        default=batching.ARRIVAL,
        help="arrival (the default, as in sim_bench.py): a step's 'batch' below is "
        "the rollouts admitted for it, which it may not have trained exactly",
    )
    a = p.parse_args()
    try:
        units = CostModel(gpus=a.gpus, rollouts_per_step=a.rollouts_per_step).units
        split = parse_split(a.split, units) if a.split else None
        out = timeline(a.kind, a.gpus, a.rollouts_per_step, a.steps, a.policy,
                       split, a.seed, a.batch_order)  # fmt: skip
    except ValueError as e:  # CostError is one: a bad cluster, split or cost
        raise SystemExit(f"sim_timeline: {e}") from None
    s, rows = out["summary"], out["rows"]
    print(f"{a.kind}, {a.gpus} GPUs, {a.rollouts_per_step} rollouts/step, {a.policy}"
          f"{' ' + a.split if a.split else ''}: makespan {s['makespan_s']:,.0f} s, "
          f"lower bound {s['lower_bound_s']:,.0f} s, efficiency {s['efficiency']:.3f}\n")  # fmt: skip
    print(
        "| step | batch admitted | batch done | slowest latency | slowest alone | "
        "publications meanwhile | earliest start | start -> published | published | "
        "waited for |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['step']} | {r['admitted']:,.0f} | {r['done']:,.0f} | {r['latency']:,.0f} | "
              f"{r['alone']:,.0f} | {r['syncs']} | {r['earliest']:,.0f} | {r['span']:,.0f} | {r['published']:,.0f} | "
              f"{'its batch' if r['critical'] else 'the step before'} |")  # fmt: skip
    crit = [r for r in rows if r["critical"]]
    tail = rows[len(rows) // 4 :]  # past the start-up
    period = (tail[-1]["published"] - tail[0]["published"]) / max(1, len(tail) - 1)
    g = s["gpu_seconds_by_role"]
    busy = g["rollout_busy"] + s["train_busy_gpu_s"]
    print(
        f"\nperiod per step (steps {tail[0]['step']}-{tail[-1]['step']}): {period:,.0f} s; "
        f"critical steps: {len(crit)} of {len(rows)}"
    )
    if crit:
        mean = statistics.mean
        print(f"critical steps (means): slowest latency {mean(r['latency'] for r in crit):,.0f} s, "
              f"the same batch's slowest alone (the bound's path) "
              f"{mean(r['alone'] for r in crit):,.0f} s, publications during the batch "
              f"{mean(r['syncs'] for r in crit):.1f} (each pauses every engine "
              f"{out['costs'].weight_sync_s:.0f} s), start -> published "
              f"{mean(r['span'] for r in crit):,.0f} s")  # fmt: skip
    print(f"GPU-hours: rollout busy {g['rollout_busy'] / 3600:,.1f}, train {g['train'] / 3600:,.1f} "
          f"(inside a step {s['train_busy_gpu_s'] / 3600:,.1f}, idle in the train role "
          f"{(g['train'] - s['train_busy_gpu_s']) / 3600:,.1f}), rollout idle "
          f"{g['rollout_idle'] / 3600:,.1f}, switching {g['switching'] / 3600:,.1f}")  # fmt: skip
    print(f"the run's busy GPU-seconds spread over all {a.gpus} GPUs: {busy / a.gpus:,.0f} s "
          f"({busy / a.gpus / len(rows):,.0f} s a step), against a makespan of "
          f"{s['makespan_s']:,.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
