"""Cluster simulator benchmark: policy comparison, simulator speed, cost sensitivity.

Prints measured figures as markdown tables (nothing is asserted):

1. ``--compare``: one table per regime (latency-, throughput- and memory-bound, moving
   demand; :func:`regimes`), with no cap on running rollouts or (``--cap step``) every
   policy capped at one step's batch, AReaL's default (``--cap best``: one summary table,
   each policy at its best of the two, async also at its best split): the makespans of colocate, async at its best fixed split
   (``gyre_core.sim.compare.best_split``: the best goodput among the splits that time out
   at most 1% more rollouts than the fewest) and elastic; the goodput ratios (elastic's
   tokens trained per second over the other's), also against the split best on the first
   quarter of the trace, and the policy-independent bound's goodput over async's (the most
   any policy could gain); each policy's timeouts, tokens trained, efficiency (goodput over
   the bound's), role switches and masked tokens; then elastic with
   ``--switch-mode restart``.
2. ``--speed``: events/s, wall time and peak RSS of one elastic simulation of 1,000 GPUs
   (125 units of 8) on 20,000 ``xlong`` rollouts (~2M LLM calls), each size in a fresh
   subprocess (``resource.getrusage(...).ru_maxrss``).
3. ``--sensitivity``: elastic vs async (best split) and vs colocate on ``xlong`` at 64
   GPUs as ``switch_s`` (0, 10, 30, 60, 120 s), the staleness bound (0, 1, 2, 4), the
   admission bound (3, 4, masking at 2) and the cap on running rollouts (1 and 2 steps'
   batches) vary.

With no section flag, all three run.

    .venv/bin/python benchmarks/sim_bench.py              # everything
    .venv/bin/python benchmarks/sim_bench.py --quick      # fewer rows, smaller speed run
    .venv/bin/python benchmarks/sim_bench.py --compare --switch-mode restart
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.scheduler.policies import make_policy
from gyre_core.sim.compare import best_split, first_quarter_split
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate

STEPS = 16  # training steps per comparison run
SEED = 0


def run(trace: list[Any], costs: CostModel, policy: str, mode: str = "migrate",
        split: tuple[int, int] | None = None) -> dict[str, Any]:  # fmt: skip
    return Simulator(trace, costs, make_policy(policy, costs.units, split), mode=mode).run()


def _pct(x: float) -> str:
    return f"{x:.3f}"


def _g(a: dict[str, Any], b: dict[str, Any]) -> float:
    """``a``'s goodput over ``b``'s."""
    return a["goodput_tok_s"] / b["goodput_tok_s"] if b["goodput_tok_s"] else 0.0


def _three(key: str, *runs: dict[str, Any], scale: float = 1.0) -> str:
    return "/".join(f"{r[key] / scale:,.0f}" if scale != 1 else f"{r[key]:,}" for r in runs)


def _gpuh(s: dict[str, Any], key: str) -> str:
    return f"{s['gpu_seconds_by_role'][key] / 3600:,.0f}"


SEEDS = Path(__file__).resolve().parents[1] / "configs" / "sim-seeds.json"

# The regimes of docs/sim-results.md, each a list of (workload kind, cost table): a
# latency-bound run waits on its longest rollouts and the admission chain; a
# throughput-bound one on the engines (many rollouts a step for the GPUs); a memory-bound
# one must hold a training state that fills over half the cluster (the seeds' preset);
# moving demand changes its rollouts' lengths over the run.
Row = tuple[str, CostModel]


def regimes(quick: bool) -> dict[str, list[Row]]:
    small = [(64, 64)] if quick else [(64, 64), (256, 128)]
    seeds = CostModel.load(SEEDS)
    return {
        "latency-bound": [
            (k, CostModel(gpus=g, rollouts_per_step=r)) for g, r in small for k in ("xlong", "mixed")
        ],
        "throughput-bound": [(k, CostModel(gpus=g, rollouts_per_step=r)) for g, r in small
                             for k in ("uniform",)]
        + [(k, CostModel(gpus=64, rollouts_per_step=256)) for k in ("xlong", "mixed", "uniform")],
        "memory-bound": [(k, seeds) for k in (("xlong",) if quick else ("xlong", "uniform"))],
        "moving demand": [
            (k, CostModel(gpus=g, rollouts_per_step=r))
            for g, r in small
            for k in ("drift", "phases", "bursts")
        ],
    }  # fmt: skip


CAPS = ("none", "step")


def capped(costs: CostModel, cap: str) -> CostModel:
    """``step``: AReaL's cap on concurrent rollouts at its default, one step's batch, for
    every policy alike; ``none``: no cap."""
    return replace(costs, max_concurrent=costs.rollouts_per_step if cap == "step" else 0)


def compare_section(rows: dict[str, list[Row]], modes: list[str], cap: str = "none") -> None:
    mode = modes[0]
    limit = "at most one step's rollouts running at once" if cap == "step" else "no cap"
    print(f"\n## Policy comparison (elastic switch mode: {mode}; {STEPS} steps, seed {SEED}; "
          f"{limit})\n")  # fmt: skip
    detail: list[str] = []
    restart: list[str] = []
    for regime, runs in rows.items():
        print(f"\n### {regime}\n")
        print("| workload | GPUs | rollouts/step | colocate s | async s (split) | elastic s "
              "| el/colo goodput | el/async goodput | el/async-q1 goodput (split) "
              "| bound/async goodput | el/async makespan | timeouts colo/async/el "
              "| trained Mtok colo/async/el | eff colo | eff async | eff elastic "
              "| binding term | switches colo/async/el | masked tok async/el |")  # fmt: skip
        print(
            "|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---|---|---:|---:|---:|---|---|---|"
        )
        for kind, base in runs:
            costs = capped(base, cap)
            gpus, rps = costs.gpus, costs.rollouts_per_step
            trace = generate(kind, STEPS * rps, SEED)
            t0 = time.perf_counter()
            colo = run(trace, costs, "colocate")
            split, asy, evaluated = best_split(trace, costs)
            q1 = first_quarter_split(trace, costs, batch_order="arrival")
            aq1 = asy if q1 == split else run(trace, costs, "async", split=q1)
            el = run(trace, costs, "elastic", mode)
            if len(modes) > 1:
                er = run(trace, costs, "elastic", modes[1])
                restart.append(
                    f"| {kind} | {gpus} | {el['makespan_s']:,.0f} | {er['makespan_s']:,.0f} | "
                    f"{colo['makespan_s'] / er['makespan_s']:.3f} | "
                    f"{asy['makespan_s'] / er['makespan_s']:.3f} | {er['efficiency']:.3f} | "
                    f"{er['sessions_restarted']:,} | {er['tokens_discarded']:,} | "
                    f"{el['calls_migrated']:,} | {el['tokens_reprefilled']:,} |"
                )
            wall = time.perf_counter() - t0
            ma = asy["makespan_s"] / el["makespan_s"]
            ceiling = el["ceiling_goodput_tok_s"] / asy["goodput_tok_s"]
            terms = el["bound_terms_s"]
            binding = max(terms, key=lambda k: terms[k])[:-2]
            print(f"| {kind} | {gpus} | {rps} | {colo['makespan_s']:,.0f} | "
                  f"{asy['makespan_s']:,.0f} ({split[0]}:{split[1]}) | {el['makespan_s']:,.0f} | "
                  f"**{_g(el, colo):.3f}** | **{_g(el, asy):.3f}** | "
                  f"{_g(el, aq1):.3f} ({q1[0]}:{q1[1]}) | {ceiling:.3f} | {ma:.3f} | "
                  f"{_three('timeouts', colo, asy, el)} | "
                  f"{_three('tokens_trained', colo, asy, el, scale=1e6)} | {_pct(colo['efficiency'])} | "
                  f"{_pct(asy['efficiency'])} | {_pct(el['efficiency'])} | {binding} | "
                  f"{colo['role_switches']}/{asy['role_switches']}/{el['role_switches']} | "
                  f"{asy['tokens_masked']:,}/{el['tokens_masked']:,} |", flush=True)  # fmt: skip
            for name, s in (("colocate", colo), ("async", asy), ("elastic", el)):
                tot = sum(s["gpu_seconds_by_role"].values())
                detail.append(
                    f"| {kind} | {gpus} | {name} | {_gpuh(s, 'rollout_busy')} | "
                    f"{_gpuh(s, 'rollout_idle')} | {_gpuh(s, 'train')} | "
                    f"{s['train_busy_gpu_s'] / 3600:,.0f} | {_gpuh(s, 'switching')} | "
                    f"{tot / 3600:,.0f} | {s['lower_bound_s']:,.0f} | {s['run_bound_s']:,.0f} | "
                    f"{s['calls_migrated']:,} | {s['tokens_prefilled'] / 1e6:,.0f} | "
                    f"{s['timeouts']} |"
                )
            splits = ", ".join(
                f"{e['split']}={e['makespan_s']:,.0f} s/{e['goodput_tok_s']:,.0f} tok/s"
                f"/{e['timeouts']} t.o."
                for e in evaluated
            )
            detail.append(
                f"|  |  | (async splits tried: {splits}; {wall:.1f} s wall) | | | | | | | | | | | |"
            )
    print("\nGPU-hours by category (train_busy: training units inside a step):\n")
    print(
        "| workload | GPUs | policy | rollout busy | rollout idle | train | train busy "
        "| switching | total | bound s | run bound s | calls migrated | prefilled Mtok "
        "| timeouts |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(detail), flush=True)
    if restart:
        print(f"\nElastic with --switch-mode {modes[1]} against {mode} (same traces):\n")
        print(
            f"| workload | GPUs | elastic {mode} s | elastic {modes[1]} s | colo/el-{modes[1]} "
            f"| async/el-{modes[1]} | eff | sessions restarted | tokens discarded "
            f"| calls migrated ({mode}) | tokens re-prefilled ({mode}) |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(restart), flush=True)


def best_cap_section(rows: dict[str, list[Row]]) -> None:
    """Each policy at its best cap on running rollouts (none or one step's batch), async
    also at its best split: the headline comparison (no baseline left at a worse setting
    than it has)."""
    print(f"\n## Each policy at its best cap ({STEPS} steps, seed {SEED})\n")
    print("| regime | workload | GPUs | rollouts/step | async tok/s (split, cap) "
          "| elastic tok/s (cap) | **el/async** | el/async-q1 (split) | bound/async "
          "| eff async | eff elastic |")  # fmt: skip
    print("|---|---|---:|---:|---|---|---:|---|---:|---:|---:|")
    for regime, runs in rows.items():
        for kind, base in runs:
            trace = generate(kind, STEPS * base.rollouts_per_step, SEED)
            asy: dict[str, Any] = {}
            el: dict[str, Any] = {}
            for cap in CAPS:
                costs = capped(base, cap)
                split, a, _ = best_split(trace, costs)
                if not asy or a["goodput_tok_s"] > asy["goodput_tok_s"]:
                    asy = {**a, "split": split, "cap": cap, "costs": costs}
                e = run(trace, costs, "elastic")
                if not el or e["goodput_tok_s"] > el["goodput_tok_s"]:
                    el = {**e, "cap": cap}
            q1 = first_quarter_split(trace, asy["costs"], batch_order="arrival")
            aq1 = asy if q1 == asy["split"] else run(trace, asy["costs"], "async", split=q1)
            r, t = asy["split"]
            print(f"| {regime} | {kind} | {base.gpus} | {base.rollouts_per_step} | "
                  f"{asy['goodput_tok_s']:,.0f} ({r}:{t}, {asy['cap']}) | "
                  f"{el['goodput_tok_s']:,.0f} ({el['cap']}) | **{_g(el, asy):.3f}** | "
                  f"{_g(el, aq1):.3f} ({q1[0]}:{q1[1]}) | "
                  f"{el['ceiling_goodput_tok_s'] / asy['goodput_tok_s']:.3f} | "
                  f"{asy['efficiency']:.3f} | {el['efficiency']:.3f} |", flush=True)  # fmt: skip


SPEED_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from gyre_core.scheduler.policies import make_policy
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate
n, gpus, rps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
trace = generate("xlong", n, 0)
t1 = time.perf_counter()
calls = sum(len(r.turns) for r in trace)
costs = CostModel(gpus=gpus, rollouts_per_step=rps)
c1 = time.process_time()
s = Simulator(trace, costs, make_policy("elastic", costs.units)).run()
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"rollouts": n, "calls": calls, "gen_s": t1 - t0, "sim_s": t2 - t1,
                  "sim_cpu_s": c2 - c1, "load": open("/proc/loadavg").read().split()[0],
                  "events": s["events"], "steps": s["steps"], "makespan_s": s["makespan_s"],
                  "efficiency": s["efficiency"],
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def speed_section(sizes: list[int], gpus: int, rps: int, budget_s: float) -> None:
    print(f"\n## Simulator speed: elastic, {gpus} GPUs ({gpus // 8} units of 8), xlong, "
          f"{rps} rollouts/step, one process per row\n")  # fmt: skip
    print(
        "| rollouts | LLM calls | steps | events | generate s | simulate s (wall) "
        "| simulate CPU s | load avg | events/s (CPU) | calls/s (CPU) | peak RSS MB "
        "| makespan s | efficiency |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    root = str(Path(__file__).resolve().parents[1])
    for n in sizes:
        try:
            out = subprocess.run([sys.executable, "-c", SPEED_CHILD, root, str(n), str(gpus),
                                  str(rps)], capture_output=True, text=True, timeout=budget_s,
                                 check=True).stdout  # fmt: skip
        except subprocess.TimeoutExpired:
            print(
                f"| {n:,} | — | — | — | — | > {budget_s:.0f} (stopped) | — | — | — | — | — | — | — |"
            )
            break
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {n:,} | {r['calls']:,} | {r['steps']} | {r['events']:,} | {r['gen_s']:.1f} | "
              f"{r['sim_s']:.1f} | {r['sim_cpu_s']:.1f} | {r['load']} | "
              f"{r['events'] / r['sim_cpu_s']:,.0f} | {r['calls'] / r['sim_cpu_s']:,.0f} | "
              f"{r['maxrss_mb']:,.0f} | "
              f"{r['makespan_s']:,.0f} | {r['efficiency']:.3f} |", flush=True)  # fmt: skip


def sensitivity_section(gpus: int, rps: int) -> None:
    trace = generate("xlong", STEPS * rps, SEED)
    base = CostModel(gpus=gpus, rollouts_per_step=rps)
    print(f"\n## Sensitivity: xlong, {gpus} GPUs, {rps} rollouts/step, {STEPS} steps\n")
    print(
        "| parameter | value | colocate s | async s (split) | elastic s | el/colo goodput "
        "| el/async goodput | el/async makespan | timeouts async/el | eff elastic "
        "| masked tok async/el | switches el |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|")
    grid: list[tuple[str, Any]] = [("switch_s", v) for v in (0.0, 10.0, 30.0, 60.0, 120.0)]
    grid += [("staleness", v) for v in (0, 1, 2, 4)]
    grid += [("admission_staleness", v) for v in (3, 4)]  # masking stays at staleness 2
    grid += [("max_concurrent", v) for v in (rps, 2 * rps)]  # AReaL's cap, 1 and 2 batches
    for name, value in grid:
        costs = replace(base, **{name: value})
        colo = run(trace, costs, "colocate")
        split, asy, _ = best_split(trace, costs)
        el = run(trace, costs, "elastic")
        print(f"| {name} | {value:g} | {colo['makespan_s']:,.0f} | {asy['makespan_s']:,.0f} "
              f"({split[0]}:{split[1]}) | {el['makespan_s']:,.0f} | "
              f"{_g(el, colo):.3f} | {_g(el, asy):.3f} | "
              f"{asy['makespan_s'] / el['makespan_s']:.3f} | "
              f"{asy['timeouts']}/{el['timeouts']} | {el['efficiency']:.3f} | "
              f"{asy['tokens_masked']:,}/{el['tokens_masked']:,} | {el['role_switches']} |",
              flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", action="store_true", help="policy comparison")
    p.add_argument("--speed", action="store_true", help="simulator speed at 1,000 GPUs")
    p.add_argument(
        "--sensitivity", action="store_true", help="switch_s, staleness and admission sweeps"
    )
    p.add_argument("--quick", action="store_true", help="64 GPUs only; speed up to 5,000 rollouts")
    p.add_argument(
        "--switch-mode",
        choices=("migrate", "restart", "both"),
        default="both",
        help="elastic's switch mode in the comparison (default: both)",
    )
    p.add_argument(
        "--cap",
        choices=(*CAPS, "best"),
        default="none",
        help="--compare: no cap on running rollouts, one step's (AReaL's default), or each "
        "policy at its best of the two (a summary table)",
    )
    p.add_argument(
        "--speed-rollouts",
        type=int,
        nargs="*",
        default=None,
        help="rollout counts for --speed (default 2000 5000 20000)",
    )
    p.add_argument(
        "--speed-budget",
        type=float,
        default=600.0,
        help="seconds allowed per speed run before it is stopped",
    )
    a = p.parse_args(argv)
    if not (a.compare or a.speed or a.sensitivity):
        a.compare = a.speed = a.sensitivity = True
    t0 = time.perf_counter()
    if a.compare:
        modes = ["migrate", "restart"] if a.switch_mode == "both" else [a.switch_mode]
        if a.cap == "best":
            best_cap_section(regimes(a.quick))
        else:
            compare_section(regimes(a.quick), modes, a.cap)
    if a.speed:
        n = a.speed_rollouts or ([2_000, 5_000] if a.quick else [2_000, 5_000, 20_000])
        speed_section(n, gpus=1_000, rps=1_000, budget_s=a.speed_budget)
    if a.sensitivity:
        sensitivity_section(gpus=64, rps=64)
    print(f"\n(total wall {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
