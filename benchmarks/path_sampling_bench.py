"""Forward-backward time of a training step against ``train.max_paths`` (J_max), on the
same batches: the step files a run wrote (``DIR/rollouts/step-*.jsonl``), trained with the
run's own ``train`` section and model (``DIR/model``), J changed and nothing else.

For each J (``--max-paths 0,5,1``) and each step file: the step's weighted trees, sampled
and packed (``BatchPlan``: timed as ``pack``), then the gradients of the batch
(``Trainer.compute_grads``: the forward and backward, timed as ``fwd_bwd``). No optimizer
step is taken, so every J meets the same weights. All J run in this one process, in turn
on each batch (a different J first on each pass), so they meet the same load. Per J it
prints the paths taken of all, the generated tokens trained of those stored, the tokens
packed (context included), the mean seconds per step of each part, and the
forward-backward time as a fraction of the first J's (the baseline).

    python benchmarks/path_sampling_bench.py DIR [--max-paths 0,5,1] [--steps 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gyre_core.config import load_config
from gyre_core.train.trainer import BatchPlan, Trainer
from gyre_core.trajectory.format import read_rollouts
from gyre_core.trajectory.paths import path_figures


def _step_files(run: Path, steps: int) -> list[tuple[int, Path]]:
    files = sorted((run / "rollouts").glob("step-*.jsonl"))
    if not files:
        raise SystemExit(f"{run}: no rollouts/step-*.jsonl (the folder of a finished gyre run)")
    numbered = [(int(re.findall(r"\d+", f.name)[-1]), f) for f in files]
    return numbered[:steps] if steps else numbered


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a gyre run's work folder (learning_bench: .../run)")
    ap.add_argument("--config", type=Path, help="its config (default: DIR/../config.yaml)")
    ap.add_argument("--max-paths", default="0,5,1", help="the J values, the baseline first")
    ap.add_argument("--steps", type=int, default=8, help="step files used (0: all)")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes over the batches")
    args = ap.parse_args()
    cfg = load_config(args.config or args.run.parent / "config.yaml")
    js = [int(j) for j in args.max_paths.split(",")]
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(args.run / "model"), dtype=torch.float32)
    files = _step_files(args.run, args.steps)
    batches = [(step - 1, list(read_rollouts(f))) for step, f in files]
    plans = {}
    for j in js:
        train = replace(cfg.train, max_paths=j)
        plans[j] = (
            BatchPlan(train, 10**6, cfg.seed),
            Trainer(model, train, staleness_bound=10**6, seed=cfg.seed),
        )
    rows = {j: dict.fromkeys(("pack_s", "fwd_bwd_s", "tokens_packed"), 0.0) for j in js}
    for rep in range(args.repeats + 1):  # pass 0 warms up and counts, untimed
        for version, rollouts in batches:
            for j in js[rep % len(js) :] + js[: rep % len(js)]:  # in turn, each first in turn
                plan, trainer = plans[j]
                row = rows[j]
                t0 = time.perf_counter()
                trees = plan.weigh(rollouts, version)
                samples = plan.prepare(rollouts, version, trees)
                t1 = time.perf_counter()
                trainer.compute_grads(samples, current_version=version)
                t2 = time.perf_counter()
                if rep == 0:
                    for k, v in path_figures(trees.values()).items():
                        row[k] = row.get(k, 0.0) + v
                    row["tokens_packed"] += sum(len(s) for s in samples)
                else:
                    row["pack_s"] += t1 - t0
                    row["fwd_bwd_s"] += t2 - t1
    base = rows[js[0]]["fwd_bwd_s"]
    for j, row in rows.items():
        share = row["fwd_bwd_s"] / base
        n = len(batches) * args.repeats
        print(
            f"J={j}: paths {row['paths_taken']:.0f}/{row['paths_total']:.0f}, generated tokens "
            f"{row['tokens_trained']:.0f}/{row['tokens_stored']:.0f}, packed "
            f"{row['tokens_packed']:.0f}; per step pack {row['pack_s'] / n:.3f} s, "
            f"forward-backward {row['fwd_bwd_s'] / n:.3f} s ({share:.1%} of J={js[0]})",
            flush=True,
        )
    json.dump({"run": str(args.run), "steps": len(batches), "by_j": rows}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
