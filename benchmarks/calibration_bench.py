"""Calibration: does the simulator, fed a real run's own measured cost table and workload,
predict that run's wall time? One real CPU demo run per policy (the demo configs, made
small: ``--units`` units, ``--steps`` steps, benchmark of 1 task), then ``gyre sim predict``
on its work folder. Prints predicted vs measured loop time, the error (target: within 25%),
each run's fitted costs and the load average around it (the machine may be shared), then
each run's table simulated under the other policies against their measured times.

    python benchmarks/calibration_bench.py [--units 4] [--steps 3] [--policies colocate,async,elastic]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GYRE = [sys.executable, "-m", "gyre_core.cli.main"]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--policies", default="colocate,async,elastic")
    ap.add_argument("--out", default=str(ROOT / ".data" / "bench" / "calibration"))
    ap.add_argument("--quick", action="store_true", help="a smoke run: elastic only, 1 step")
    args = ap.parse_args()
    if args.quick:
        args.policies, args.steps = "elastic", 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for policy in args.policies.split(","):
        cfg = yaml.safe_load((ROOT / "configs" / f"demo-{policy}.yaml").read_text())
        cfg.update(name=f"calibrate-{policy}", steps=args.steps)
        cfg["cluster"]["units"] = args.units
        cfg["rollout"]["benchmark_tasks"] = 1
        config = out / f"{policy}.yaml"
        config.write_text(yaml.safe_dump(cfg))
        work = out / policy
        shutil.rmtree(work, ignore_errors=True)
        before = loadavg()
        t0 = time.perf_counter()
        run = subprocess.run([*GYRE, "run", str(config), "--json", "--workdir", str(work)],
                             capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        if run.returncode != 0:
            print(f"{policy}: gyre run failed ({run.returncode}):\n{run.stderr[-2000:]}")
            return 1
        wall = time.perf_counter() - t0
        pred = subprocess.run([*GYRE, "sim", "predict", str(work), "--json"],
                              capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
        row = json.loads(pred.stdout)
        row.update(load_before=before, load_after=loadavg(), process_wall_s=round(wall, 1))
        rows.append(row)
        c = row["costs"]
        print(
            f"{policy:9} predicted {row['predicted_s']:7.2f} s  measured {row['actual_s']:7.2f} s  "
            f"error {row['error']:+7.1%}  | decode peak {c['decode_peak_tok_s']:.4g} half "
            f"{c['decode_half']:.4g}  prefill {c['prefill_tok_s']:.4g}  train {c['train_tok_s']:.4g}"
            f"  switch {c['switch_s']:.3f}  sync {c['weight_sync_s']:.3f}  overhead "
            f"{c['step_overhead_s']:.3f}  | loadavg {before} -> {row['load_after']}",
            flush=True,
        )
    # Portability: each run's table and workload, simulated under every policy, against the
    # wall time that policy's own run measured (the workloads are the same seeded tasks).
    from gyre_core.runtime.calibrate import predict

    actual = {r["policy"]: r["actual_s"] for r in rows}
    print("table of \\ simulated as " + "".join(f"{p:>20}" for p in actual))
    for src in actual:
        cells = []
        for p, a in actual.items():
            x = predict(out / src, policy=p)["predicted_s"]
            cells.append(f"{x:8.2f} s ({(x - a) / a:+6.1%})")
        print(f"{src:22}" + "".join(f"{c:>20}" for c in cells))
    worst = max(abs(r["error"]) for r in rows)
    print(f"worst |error| {worst:.1%} (target: within 25%)")
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    return 0 if worst <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
