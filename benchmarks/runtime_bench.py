"""The real runtime under colocate, async and elastic (and elastic in restart mode) on the
same CPU demo: wall time per step, role switches, migrated calls, sessions restarted,
benchmark before/after. Prints one row per run and writes the summaries as JSON.

    python benchmarks/runtime_bench.py [--steps 4] [--out .data/bench/runtime.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from dataclasses import replace
from pathlib import Path

from gyre_core.config import load_config
from gyre_core.events import NullSink
from gyre_core.runtime import run_job

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / ".data" / "bench" / "runtime.json"))
    ap.add_argument("--policies", default="colocate,async,elastic,elastic-restart")
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: colocate and elastic, 1 step each"
    )
    args = ap.parse_args()
    if args.quick:
        args.policies, args.steps = "colocate,elastic", 1
    rows = []
    model = ROOT / ".data" / "bench" / "model"
    for name in args.policies.split(","):
        policy, _, mode = name.partition("-")
        cfg = load_config(ROOT / "configs" / f"demo-{policy}.yaml")
        cfg = replace(
            cfg,
            steps=args.steps,
            scheduler=replace(cfg.scheduler, switch_mode=mode or "migrate"),
            model=replace(
                cfg.model, checkpoint=str(model) if (model / "config.json").exists() else ""
            ),
        )
        work = ROOT / ".data" / "bench" / name
        out = run_job(cfg, sink=NullSink(), workdir=work)
        if not cfg.model.checkpoint and (work / "model").exists() and not model.exists():
            (work / "model").rename(model)  # every policy then starts from the same weights
        out["name"] = name
        rows.append(out)
        print(
            f"{name:16} s/step {out['step_s_mean']:7.2f}  wall {out['wall_s']:7.1f} s  switches "
            f"{out['role_switches']:3}  migrated {out['calls_migrated']:3}  restarted "
            f"{out['sessions_restarted']:3}  discarded {out['tokens_discarded']:5}  "
            f"bench {out['benchmark_before']:.3f} -> {out['benchmark_after']:.3f}",
            flush=True,
        )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"peak RSS of one child process: {peak:.0f} MB; driver: "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
