"""The paper's comparisons in Gyre's simulator: its baselines as it ran them (boundary
dispatch for all three policies), beside its figures, and its ablations.

Prints markdown tables (nothing is asserted), each row one ``gyre_core.sim.compare``
(colocate, async at its best fixed split, elastic) on one trace and cost table:

1. **Like for like**: every policy under boundary dispatch (``--burst-steps``: 1, and the
   longest burst admission allows, ``admission_ahead + 1`` steps), whole-batch steps and
   streaming; elastic's goodput over async's and over colocate's, beside the paper's
   1.78x and 1.21x.
2. **Ablations**, from the same runs: streaming alone on async (the paper: 11.6 % less
   time), elastic over colocate with streaming (the paper: 1.19x for elastic cells on
   streaming colocate), single- against multi-step bursts (the paper: single-step bursts
   10.9 % slower).

Each row's regime line (``gyre_core.sim.regime``) says which regime it is in.

    .venv/bin/python benchmarks/sim_paper.py            # ~10 min on 2 cores
    .venv/bin/python benchmarks/sim_paper.py --quick    # the seeds' preset only
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.sim.compare import compare
from gyre_core.sim.costs import CostModel
from gyre_core.sim.regime import describe
from gyre_core.sim.workload import generate

ROOT = Path(__file__).resolve().parents[1]
STEPS = 16
SEED = 0
PAPER = {"el/async": 1.78, "el/colo": 1.21, "streaming on async": -0.116,
         "elastic on streaming colocate": 1.19, "single-step bursts": 0.109}  # fmt: skip


def rows(quick: bool) -> list[tuple[str, str, CostModel]]:
    seeds = CostModel.load(ROOT / "configs/sim-seeds.json")
    out = [("seeds' preset", "paper", seeds)]
    throughput = ROOT / "configs/sim-seeds-throughput.json"
    if throughput.exists() and not quick:
        out.append(("throughput preset", "decode", CostModel.load(throughput)))
    if not quick:
        out.append(("defaults, 64 GPUs", "xlong", CostModel(gpus=64, rollouts_per_step=64)))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the seeds' preset only")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    print("\n## Like for like: boundary dispatch for every policy\n")
    print("| costs | workload | burst steps | steps | colocate s | async s (split) | elastic s "
          "| el/async | el/colo | paper el/async | paper el/colo |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    ablations: list[str] = []
    regimes: list[str] = []
    for label, kind, base in rows(a.quick):
        trace = generate(kind, STEPS * base.rollouts_per_step, SEED)  # type: ignore[arg-type]
        got: dict[tuple[int, int], dict[str, Any]] = {}
        longest = base.admission_ahead + 1  # the longest burst admission (and the cap) allow
        if base.max_concurrent:
            longest = min(longest, max(1, base.max_concurrent // base.rollouts_per_step))
        for burst in sorted({1, longest}):
            for streaming in (0, 1):
                costs = replace(base, burst_steps=burst, streaming=streaming)
                r = compare(trace, costs)
                got[burst, streaming] = r
                print(f"| {label} | {kind} | {burst} | {'streaming' if streaming else 'whole'} "
                      f"| {r['colocate']['makespan_s']:,.0f} | {r['async']['makespan_s']:,.0f} "
                      f"({r['async']['split']}) | {r['elastic']['makespan_s']:,.0f} "
                      f"| {r['elastic_vs_async']:.3f} | {r['elastic_vs_colocate']:.3f} "
                      f"| {PAPER['el/async']} | {PAPER['el/colo']} |", flush=True)  # fmt: skip
        regimes.append(f"- {label}, `{kind}`: {describe(got[1, 0]['regime'])}")
        asy = {k: r["async"]["makespan_s"] for k, r in got.items()}
        el = {k: r["elastic"]["makespan_s"] for k, r in got.items()}
        stream_async = asy[1, 1] / asy[1, 0] - 1
        el_on_stream_colo = got[1, 1]["makespan_vs_colocate"]
        single = {p: m[1, 0] / m[longest, 0] - 1 for p, m in (("async", asy), ("elastic", el))}
        ablations.append(
            f"| {label} | {kind} | {stream_async:+.1%} | {el_on_stream_colo:.3f} "
            f"| {single['async']:+.1%} / {single['elastic']:+.1%} |"
        )
    print("\n## Ablations\n")
    print(
        "| costs | workload | streaming alone on async (time) | elastic over colocate, "
        "streaming (makespan) | single- against multi-step bursts, async / elastic (time) |"
    )
    print("|---|---|---:|---:|---:|")
    print("\n".join(ablations))
    print(
        f"| the paper | NL2RepoBench | {PAPER['streaming on async']:+.1%} "
        f"| {PAPER['elastic on streaming colocate']} | +{PAPER['single-step bursts']:.1%} |"
    )
    print("\nRegimes:\n")
    print("\n".join(regimes))
    print(f"\n(total wall {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
