"""The rows of docs/sim-results.md that lending the trainer could change, quickly: elastic
(and, with ``--async``, async at its best split; ``--colocate``: colocate; ``--no-lend``:
elastic as it was before it lent the trainer, ``Elastic(lend=False)``) on each row's
trace, one simulation at a time, goodput printed as each finishes. Rows are built as
``sim_bench.regimes`` builds them (no cap on running rollouts, 16 steps, seed 0);
``throughput-preset`` is ``configs/sim-seeds-throughput.json`` on ``decode``.

    .venv/bin/python benchmarks/lend_check.py                      # elastic on every row
    .venv/bin/python benchmarks/lend_check.py --async --rows seeds-uniform
    .venv/bin/python benchmarks/lend_check.py --rows throughput-preset --set staleness=2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.scheduler.policies import Elastic, make_policy
from gyre_core.sim.compare import best_split
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate

ROOT = Path(__file__).resolve().parents[1]
STEPS, SEED = 16, 0


def rows() -> dict[str, tuple[str, CostModel]]:
    seeds = CostModel.load(ROOT / "configs" / "sim-seeds.json")
    return {
        "latency-xlong-64-64": ("xlong", CostModel(gpus=64, rollouts_per_step=64)),
        "throughput-uniform-64-64": ("uniform", CostModel(gpus=64, rollouts_per_step=64)),
        "throughput-mixed-64-256": ("mixed", CostModel(gpus=64, rollouts_per_step=256)),
        "seeds-uniform": ("uniform", seeds),
        "seeds-xlong": ("xlong", seeds),
        "throughput-preset": (
            "decode",
            CostModel.load(ROOT / "configs" / "sim-seeds-throughput.json"),
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="*", default=list(rows()), choices=list(rows()))
    p.add_argument("--async", dest="asy", action="store_true", help="also best-split async")
    p.add_argument("--colocate", action="store_true", help="also colocate")
    p.add_argument("--no-lend", action="store_true", help="also elastic that never lends")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON", help="cost overrides")
    a = p.parse_args()
    over = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.set)}
    for name in a.rows:
        kind, costs = rows()[name]
        costs = replace(costs, **over)
        trace = generate(kind, STEPS * costs.rollouts_per_step, SEED)
        t0 = time.perf_counter()
        runs = {"elastic": Simulator(trace, costs, make_policy("elastic", costs.units)).run()}
        if a.no_lend:
            runs["elastic, no lending"] = Simulator(trace, costs, Elastic(lend=False)).run()
        if a.colocate:
            runs["colocate"] = Simulator(trace, costs, make_policy("colocate", costs.units)).run()
        if a.asy:
            split, runs["async"], _ = best_split(trace, costs)
            runs[f"async ({split[0]}:{split[1]})"] = runs.pop("async")
        for policy, r in runs.items():
            print(f"| {name} | {policy} | {r['goodput_tok_s']:,.0f} | {r['makespan_s']:,.0f} | "
                  f"{r['timeouts']} | {r['tokens_trained'] / 1e6:,.0f} | "
                  f"{r['tokens_masked'] / 1e6:,.1f} | {r['role_switches']} |", flush=True)  # fmt: skip
        print(f"({name}: {time.perf_counter() - t0:.0f} s wall)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
