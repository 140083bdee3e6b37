"""The training group re-formed many times on real Ray actors: 2 units x 2 processes (gloo),
the width moving through every pattern a run can take (both units, one, the other, none:
the state offloaded), a training step at every width, each re-formation under a deadline.

It prints how many re-formations ran, the seconds of their parts (median and max), and the
largest relative difference of the final parameters from the plain trainer's after the
same steps: a group that hangs, loses state or crosses another formation shows here.

    .venv/bin/python benchmarks/group_reform_stress.py [--rounds 50] [--deadline 120]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.config import RunConfig
from gyre_core.runtime.plan import train_setup
from gyre_core.runtime.ray_backend import start_ray
from gyre_core.runtime.real_job import _make_units, release_units
from gyre_core.runtime.train_group import TrainGroup, fetch_weights
from gyre_core.train.trainer import Trainer
from tests.train.test_trainer import sample_rollouts, tiny_model

PATTERN = [[0, 1], [0], [0, 1], [1], [], [0], [1], [0, 1]]  # [] = the state offloaded


def _batch(version: int) -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=3, group_size=4, length=6, seed=version,
                           version=version)  # fmt: skip


async def _stress(cfg: RunConfig, work: Path, rounds: int, deadline: float) -> tuple[dict, dict]:  # type: ignore[type-arg]
    slots = await _make_units(cfg, Path(cfg.model.checkpoint), work)
    group = TrainGroup(cfg, work)
    parts: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            for units in PATTERN:
                t0 = time.perf_counter()
                got = await asyncio.wait_for(group.resize([slots[u] for u in units]), deadline)
                for k, v in {**got, "resize_s": time.perf_counter() - t0}.items():
                    parts.setdefault(k, []).append(v)
                if units:
                    v = group.version
                    step = group.step(group.prepare(_batch(v), v), v)
                    metrics = await asyncio.wait_for(step, deadline)
                    assert metrics["skipped"] == 0.0, f"step {v} was skipped"
            print(f"round {r + 1}/{rounds}: version {group.version}", flush=True)
        if not group.wanted:
            await group.resize([slots[0]])
        weights = fetch_weights(await group.weights())
    finally:
        release_units(slots)
    return weights, parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50, help=f"passes over {len(PATTERN)} widths")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds a re-form may take")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gyre-stress-") as tmp:
        model_dir = Path(tmp) / "model"
        tiny_model().save_pretrained(model_dir)
        cfg = RunConfig.from_dict({"cluster": {"units": 2, "gpus_per_unit": 2},
                                   "model": {"checkpoint": str(model_dir)}})  # fmt: skip
        start_ray("", 2, 2, 256)
        t0 = time.perf_counter()
        try:
            got, parts = asyncio.run(_stress(cfg, Path(tmp) / "run", args.rounds, args.deadline))
        finally:
            ray.shutdown()
        wall = time.perf_counter() - t0
        plain = Trainer.for_run(tiny_model(), train_setup(cfg))
        steps = args.rounds * sum(1 for u in PATTERN if u)
        for v in range(steps):
            plain.step(_batch(v))
    worst = max(float((got[n] - p.detach()).norm() / p.detach().norm().clamp_min(1e-12))
                for n, p in plain.model.named_parameters())  # fmt: skip
    init = tiny_model().state_dict()
    moved = max(float((got[n] - init[n]).abs().max()) for n in init)
    print(f"{len(parts['resize_s'])} re-formations, {steps} steps in {wall:.0f} s")
    for k, v in parts.items():
        print(f"  {k:12s} n={len(v):4d}  median {statistics.median(v):.3f} s  max {max(v):.3f} s")
    print(f"final parameters against the plain trainer: {worst:.2e} relative "
          f"(they moved from the initial ones by up to {moved:.2e})")  # fmt: skip
    sys.exit(0 if worst < 1e-5 and moved > 0 else 1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
