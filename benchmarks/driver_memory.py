"""The driver of a real run holds no model: its peak memory does not grow with the model.

Runs one short real job (Ray units, engines, the training group) in this process, the
driver, and prints the driver's peak resident memory (``ru_maxrss``) before and after it,
with the model's size and its full training state (fp32 weights, gradients and two AdamW
moments: 16 bytes a parameter) for comparison. Run it for the tiny default model and for
one of Qwen3-0.6B's shape (random weights, a vocabulary of 1024) and compare::

    OMP_NUM_THREADS=1 python benchmarks/driver_memory.py --shape tiny
    OMP_NUM_THREADS=1 python benchmarks/driver_memory.py --shape 0.6b

Defaults: the ``async`` policy on 2 units x 2 processes (one unit serves rollouts, the
other trains, its 2 processes sharding the state), 1 RL step. Memory: about 10 GB for
0.6b (the training unit's state, the engine's weights), a few hundred MB for tiny.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_suite_common import SHAPES  # a sibling module: the shapes live there

from gyre_core.config import RunConfig
from gyre_core.events import NullSink
from gyre_core.runtime import run_job
from gyre_core.runtime.ray_backend import start_ray


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def model_dir(shape: str, root: Path) -> Path | None:
    """A random-weight checkpoint of ``shape`` (None: the run builds its tiny default),
    built in a child process so that the driver's peak memory does not count it."""
    if shape == "tiny":
        return None
    child = multiprocessing.get_context("spawn").Process(target=_build, args=(shape, root))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"building the {shape} checkpoint failed ({child.exitcode})")
    return root / "model"


def _build(shape: str, root: Path) -> None:
    from gyre_core.models.init import init_checkpoint
    from gyre_core.models.shape import ModelShape

    spec = ModelShape(1024, max_positions=4096, **SHAPES[shape])  # type: ignore[arg-type]
    init_checkpoint(root / "model", spec, seed=0, overwrite=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=["tiny", *sorted(SHAPES)], default="tiny")
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--per-unit", type=int, default=2)
    ap.add_argument("--policy", default="async")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd() / ".data") as tmp:
        root = Path(tmp)
        ckpt = model_dir(args.shape, root)
        scheduler: dict[str, Any] = {"policy": args.policy, "drain_deadline_s": 0.0}
        if args.policy == "async":
            scheduler["rollout_units"] = args.units - 1  # the others train
        cfg = RunConfig.from_dict(
            {
                "backend": "real",
                "steps": args.steps,
                "cluster": {
                    "units": args.units,
                    "gpus_per_unit": args.per_unit,
                    "object_store_mb": 4096,
                },
                "scheduler": scheduler,
                "model": {"checkpoint": str(ckpt)} if ckpt else {},
                "rollout": {
                    "tasks_per_step": 1,
                    "group_size": 2,
                    "max_turns": 2,
                    "max_new_tokens": 8,
                    "benchmark_tasks": 1,
                },
            }
        )
        start_ray("", args.units, args.per_unit, 4096)
        before = peak_mb()
        t0 = time.perf_counter()
        out = run_job(cfg, sink=NullSink(), workdir=root / "run")
        wall = time.perf_counter() - t0
        from transformers import AutoConfig

        conf = AutoConfig.from_pretrained(str(ckpt or root / "run" / "model"))
    params = _params(conf)
    row = {
        "shape": args.shape,
        "units": args.units,
        "per_unit": args.per_unit,
        "policy": args.policy,
        "status": out["status"],
        "params": params,
        "training_state_mb": round(params * 16 / 2**20, 1),
        "driver_peak_mb_before": round(before, 1),
        "driver_peak_mb": round(peak_mb(), 1),
        "wall_s": round(wall, 1),
    }
    print(
        f"{args.shape}: {params / 1e6:.1f}M parameters, full training state "
        f"{row['training_state_mb']:.0f} MB; driver peak RSS {row['driver_peak_mb']:.0f} MB "
        f"({row['driver_peak_mb_before']:.0f} MB before the run); {args.units} units x "
        f"{args.per_unit} processes, {args.policy}, {args.steps} step(s), {wall:.0f} s, "
        f"{out['status']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1) + "\n")
    return 0 if out["status"] == "succeeded" else 1


def _params(conf: Any) -> int:
    """The parameter count of a Qwen3 config (built on the meta device: no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    raise SystemExit(main())
