"""Sharded training at scale on the CPU: a gloo world of ``--units`` training units of
``--per-unit`` processes (``ShardedTrainer``: FSDP2 within a unit, replicas across units)
trains a randomly initialised model of a named shape (``gpu_suite_common.SHAPES``) in fp32 for
``--steps`` RL steps on a fixed synthetic agentic batch, one torch thread per process.

Each process reports its peak RSS (``ru_maxrss``), its increase over the process before
the model was built, and its step times; the table sets them beside the full training
state (fp32 weights + gradients + two AdamW moments, 16 bytes a parameter) and a process's
expected share of it (full / ``--per-unit``: a unit's processes shard it). Tokens/s per
process: the fresh tokens a step trains / the step's time / the processes.

``--recompute`` checkpoints every decoder layer's activations (``train.activation_checkpointing``:
a layer keeps its input and recomputes the rest in the backward pass). At
Qwen3-0.6B's shape the fp32 activations of one 1,000-token sample outweigh a process's
share of the state without it (2 x 2 processes then need more than 24 GiB). The processes
take every allocation of 1 MiB or more straight from the OS (``MALLOC_MMAP_THRESHOLD_``),
so freed activations leave the RSS instead of staying in glibc's heap.

    python benchmarks/scale_check.py --shape 0.6b --units 2 --per-unit 2 --steps 3 --recompute
    python benchmarks/scale_check.py --shape tiny --units 1 --per-unit 2 --steps 1  # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))  # read by each spawned process

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_suite_common import (
    SHAPES,
    STATE_BYTES,
    agentic_batch,
    bench_trainer,
    model_config,
)
from gyre_core.models.model import build_model
from gyre_core.models.shape import ModelShape
from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer
from gyre_core.train.losses import count_fresh
from gyre_core.train.sharded import ShardedTrainer, unit_mesh

MAX_TOKENS = 1024  # per packed sample: the batch packs into more samples than processes


def local_vocab() -> int:
    """The vocabulary of the tokenizer ``gyre model init`` trains by default."""
    return len(as_hf_tokenizer(train_tokenizer(default_corpus(), ModelShape().vocab_size)))


def peak_rss() -> int:
    """This process's peak resident set, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _process(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    world = args.units * args.per_unit
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rollouts = agentic_batch(args.vocab, quick=True, groups=args.groups)
        baseline = peak_rss()
        model = build_model(model_config(args.shape, args.vocab), seed=0)
        params = sum(p.numel() for p in model.parameters())
        built = peak_rss()
        trainer = ShardedTrainer(
            bench_trainer(model, "dense", MAX_TOKENS, recompute=args.recompute),
            unit_mesh(args.units, args.per_unit),
        )
        del model
        samples = trainer.trainer.prepare(rollouts, 0)
        times, metrics = [], []
        for _ in range(args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            metrics.append(trainer.step(rollouts, current_version=0))  # the same work each step
            times.append(time.perf_counter() - t0)
        mine = {"rank": rank, "unit": rank // args.per_unit, "baseline_rss_bytes": baseline,
                "built_rss_bytes": built, "peak_rss_bytes": peak_rss(), "step_s": times}  # fmt: skip
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            batch = {"rollouts": len(rollouts), "samples": len(samples),
                     "packed_tokens": sum(len(s) for s in samples),
                     "fresh_tokens": count_fresh(samples, 0, trainer.trainer.staleness_bound)}  # fmt: skip
            result = {
                "parameters": params,
                "batch": batch,
                "metrics": metrics,
                "processes": everyone,
            }
            Path(out).write_text(json.dumps(result))
        dist.barrier()  # every rank is past its last collective before any tears down
    finally:
        dist.destroy_process_group()
    # Gloo's worker threads may still hold tensors at interpreter teardown, which can abort
    # a process whose work is done; its result is written, so it leaves without teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run (``_process``'s output) as the JSON ``--json`` writes."""
    world = args.units * args.per_unit
    procs = run["processes"]
    for p in procs:
        p["peak_increase_bytes"] = p["peak_rss_bytes"] - p["baseline_rss_bytes"]
    step_s = [max(p["step_s"][k] for p in procs) for k in range(args.steps)]
    steady = step_s[1:] or step_s  # the first step also allocates AdamW's moments
    fresh = run["batch"]["fresh_tokens"]
    full = run["parameters"] * STATE_BYTES
    return {
        "shape": args.shape, "vocab": args.vocab, "units": args.units, "per_unit": args.per_unit,
        "world": world, "steps": args.steps, "recompute": args.recompute, "torch": torch.__version__, "threads_per_process": 1,
        "parameters": run["parameters"], "full_state_bytes": full,
        "share_bytes": full // args.per_unit, "batch": run["batch"],
        "step_s": step_s, "steady_step_s": sum(steady) / len(steady),
        "tokens_per_s_per_process": fresh / (sum(steady) / len(steady)) / world,
        "loss": [m["loss"] for m in run["metrics"]],
        "grad_norm": [m["grad_norm"] for m in run["metrics"]],
        "processes": procs,
    }  # fmt: skip


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def print_table(r: dict[str, Any]) -> None:
    b = r["batch"]
    print(f"{r['shape']}: {r['parameters'] / 1e6:.1f}M parameters (vocabulary {r['vocab']}), "
          f"{r['units']} units x {r['per_unit']} processes, fp32, torch {r['torch']}, "
          f"1 thread a process{', activations recomputed' if r['recompute'] else ''}")  # fmt: skip
    print(f"batch: {b['rollouts']} rollouts, {b['samples']} packed samples, "
          f"{b['packed_tokens']} packed tokens, {b['fresh_tokens']} fresh tokens trained a step")  # fmt: skip
    print(f"full training state (16 B/param) {_gib(r['full_state_bytes'])} GiB; "
          f"a process's share (/ {r['per_unit']}) {_gib(r['share_bytes'])} GiB")  # fmt: skip
    print("\n| rank | unit | RSS before model (GiB) | peak after build | peak | peak increase "
          "| increase / share | step times (s) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for p in r["processes"]:
        times = ", ".join(f"{t:.1f}" for t in p["step_s"])
        print(f"| {p['rank']} | {p['unit']} | {_gib(p['baseline_rss_bytes'])} "
              f"| {_gib(p['built_rss_bytes'])} | {_gib(p['peak_rss_bytes'])} "
              f"| {_gib(p['peak_increase_bytes'])} "
              f"| {p['peak_increase_bytes'] / r['share_bytes']:.2f} | {times} |")  # fmt: skip
    print()
    for k, (t, loss) in enumerate(zip(r["step_s"], r["loss"], strict=True), 1):
        print(f"step {k}: {t:.1f} s (slowest process), loss {loss:.5f}")
    print(f"tokens/s per process: {r['tokens_per_s_per_process']:.1f} "
          f"({b['fresh_tokens']} fresh tokens / {r['steady_step_s']:.1f} s "
          f"({'mean of steps 2..' if r['steps'] > 1 else 'step 1'}) / {r['world']} processes)")  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    ap.add_argument("--units", type=int, default=2, help="training units (replicas)")
    ap.add_argument("--per-unit", type=int, default=2, help="processes a unit shards over")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=3, help="GRPO groups of 4 rollouts a batch")
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing per layer")
    ap.add_argument("--vocab", type=int, default=0, help="0: the local tokenizer's size")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if min(args.units, args.per_unit, args.steps, args.groups) < 1:
        ap.error("--units, --per-unit, --steps and --groups must be >= 1")
    args.vocab = args.vocab or local_vocab()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        world = args.units * args.per_unit
        mp.spawn(_process, args=(args, port, str(out)), nprocs=world, join=True)
        r = report(args, json.loads(out.read_text()))
    print_table(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    return r


if __name__ == "__main__":
    main()
