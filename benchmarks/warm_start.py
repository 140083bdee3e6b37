"""Run a learning config's supervised warm start once and keep its weights, for
``train.warm_start_from``.

The warm start (scripted demonstrations of training tasks, docs/learning.md) is the slow,
machine-sensitive part of the learning demo: where its copy transition falls moves by
hundreds of steps with the arithmetic of the CPU it runs on. This script runs it exactly as
``gyre run`` does (``SessionFactory.warm_start``), scores the greedy held-out benchmark
every ``--every`` steps, and writes the weights of the step it stopped at, with a JSON of the
same stem beside them (steps, losses, seconds, the benchmark curve, the command, the machine).

    python benchmarks/warm_start.py configs/learn-elastic.yaml --out W.safetensors
        [--steps 1600] [--every 100] [--set train.warm_start_skip_check=0.5 ...]

``--steps`` caps the steps (default: the config's ``train.warm_start_steps``); the config's
``train.warm_start_until_loss`` still ends it early. The config's
``train.warm_start_anneal_steps`` then follow at ``train.warm_start_anneal_lr``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_bench import apply_overrides

from gyre_core.config import RunConfig
from gyre_core.events import NullSink
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.session import SessionFactory, make_model_dir


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data = yaml.safe_load(Path(args.config).read_text())
    apply_overrides(data, tuple(args.set))
    cfg = RunConfig.from_dict(data)
    t = replace(cfg.train, warm_start_cache="", warm_start_from="")
    cfg = replace(cfg, train=t)
    cap = args.steps or t.warm_start_steps
    if cap < 1:
        raise SystemExit("no warm start to run: give --steps or train.warm_start_steps")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_dir = make_model_dir(cfg, Path(args.workdir))
    factory = SessionFactory(cfg, model_dir, NullSink(), time.perf_counter)
    trainer = factory.make_trainer()
    losses: list[float] = []
    curve: dict[int, float] = {}
    t0 = time.perf_counter()
    every = args.every or cap
    router = Router({"local": TorchEngine(trainer.model)})  # the trained weights, in place
    while len(losses) < cap:
        want = min(len(losses) + every, cap)
        factory.cfg = replace(cfg, train=replace(t, warm_start_steps=want))
        losses += await factory.warm_start(trainer, first_step=len(losses), anneal=False)
        curve[len(losses)] = await report(factory, router, losses, t0)
        if len(losses) < want:  # train.warm_start_until_loss ended it (checked per chunk)
            break
    main_steps = len(losses)
    if t.warm_start_anneal_steps:
        losses += await factory.anneal(trainer, main_steps)
        curve[len(losses)] = await report(factory, router, losses, t0)
    seconds = round(time.perf_counter() - t0, 1)
    for task in asyncio.all_tasks():  # the engine's idle loop
        if task is not asyncio.current_task():
            task.cancel()
    save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, str(out))
    meta = {
        "steps": len(losses),
        "anneal_from": main_steps,
        "seconds": seconds,
        "losses": [round(x, 5) for x in losses],
        "benchmark_by_step": curve,
        "config": data,
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.processor() or platform.machine()}, "
        f"loadavg at end {Path('/proc/loadavg').read_text().split()[:3]}",
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


async def report(factory: SessionFactory, router: Router, losses: list[float], t0: float) -> float:
    score = await factory.benchmark(router, 0)
    recent = losses[-20:]
    print(f"step {len(losses)}: loss (last 20) {sum(recent) / len(recent):.3f}  "
          f"benchmark {score:.3f}  {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    return score


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--out", required=True, help="weights file to write (.safetensors)")
    ap.add_argument("--steps", type=int, default=0, help="cap (0: train.warm_start_steps)")
    ap.add_argument("--every", type=int, default=100, help="benchmark every k steps")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--workdir", default=".data/bench/warm-start")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 20 warm-start steps and 5 annealing steps, scored once after each",
    )
    args = ap.parse_args()
    if args.quick:
        args.steps, args.every = args.steps or 20, 0
        args.set = ["train.warm_start_anneal_steps=5", *args.set]
    meta = asyncio.run(run(args))
    print(f"wrote {args.out}: {meta['steps']} steps in {meta['seconds']:.0f} s, "
          f"benchmark {list(meta['benchmark_by_step'].values())[-1]:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
