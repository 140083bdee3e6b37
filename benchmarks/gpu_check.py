"""The trainer on one device, without Ray: what a GPU machine with only PyTorch and
transformers can run (prints measured figures; nothing is asserted).

1. **Sharded step.** One training unit of one process (``ShardedTrainer`` over a 1 x 1
   mesh: FSDP2 with its mixed-precision policy, NCCL on CUDA, gloo on CPU) trains a
   Qwen3-shaped model (random weights) for ``--steps`` steps on a tree-packed agentic
   batch: seconds a step, packed tokens a second, MFU (6 N tokens/s over ``--peak-tflops``),
   peak device memory.
2. **Agreement.** The first step's loss at ``--precision`` on the device against the plain
   trainer in fp32 on the CPU, on the same batch and weights (the loss is computed before
   the update, so both see the same weights).
3. **Tree against linear.** One forward + backward over the batch as tree-packed samples
   (flex attention on CUDA, the block-sparse path on CPU) against each rollout branch as
   its own causal sequence (SDPA): the speed ratio beside the workload's dedup ratio.

    python benchmarks/gpu_check.py                  # Qwen3-0.6B's shape, on CUDA if present
    python benchmarks/gpu_check.py --quick          # a tiny shape on the CPU (seconds)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trajectory_bench import CPU_WORKLOADS, branch_sequences, linear_pass, tree_pass
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train.config import TrainConfig
from gyre_core.train.sharded import ShardedTrainer, unit_mesh
from gyre_core.train.trainer import Trainer, TrainerOptions
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.rewards import assign_weights
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.synth import synth_rollouts
from gyre_core.trajectory.tree import build_trees

# Qwen3-0.6B's published shape (its vocabulary cut to --vocab), and a tiny one for --quick.
SHAPES = {
    "0.6b": dict(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
    "1.7b": dict(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144),
    "tiny": dict(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128),
}
STATE_BYTES = 4 + 4 + 8  # a parameter's fp32 training state: weight, gradient, AdamW moments


def model_config(shape: str, vocab: int) -> Qwen3Config:
    """The transformers config of ``SHAPES[shape]`` with a vocabulary of ``vocab``."""
    return tiny_qwen3_config(ModelShape(vocab, max_positions=16_384, **SHAPES[shape]))


def agentic_batch(vocab: int, quick: bool, groups: int | None = None) -> list[Rollout]:
    """The synthetic agentic batch (``agentic-cpu``), or with ``quick`` a small one (groups
    of 4 rollouts, 4 turns, a 200-token task prompt); ``groups`` GRPO groups if given."""
    cfg = replace(CPU_WORKLOADS["agentic-cpu"], vocab_size=vocab, version=0)
    if quick:
        cfg = replace(cfg, groups=1, group_size=4, turns=4, system_tokens=200, tool_tokens=40)
    if groups is not None:
        cfg = replace(cfg, groups=groups)
    return list(synth_rollouts(cfg))


def bench_trainer(
    model: torch.nn.Module,
    attention: str,
    max_tokens: int = 8192,
    precision: str = "fp32",
    recompute: bool = False,
) -> Trainer:
    """The benchmarks' trainer; ``recompute``: ``train.activation_checkpointing``."""
    train = TrainConfig(
        max_tokens=max_tokens, precision=precision, activation_checkpointing=recompute
    )
    return Trainer(
        model,  # type: ignore[arg-type]
        train,
        staleness_bound=4,
        seed=0,
        options=TrainerOptions(attention=attention),  # type: ignore[arg-type]
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def sharded_steps(args: argparse.Namespace, conf, device: torch.device, rollouts) -> float:  # type: ignore[no-untyped-def]
    attn, impl = ("flex_attention", "flex") if device.type == "cuda" else ("sdpa", "dense")
    model = build_model(conf, seed=0, attn_implementation=attn).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    state_bytes = n_params * STATE_BYTES
    trainer = ShardedTrainer(
        bench_trainer(model, impl, precision=args.precision), unit_mesh(1, 1, device.type)
    )
    packed = sum(len(s) for s in trainer.trainer.prepare(rollouts, 0))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first_loss, times = float("nan"), []
    for k in range(args.steps):
        _sync(device)
        t0 = time.perf_counter()
        m = trainer.step(rollouts, current_version=0)  # the same work every step
        _sync(device)
        times.append(time.perf_counter() - t0)
        if k == 0:
            first_loss = m["loss"]
        print(
            f"step {k + 1}: {times[-1]:.2f} s, loss {m['loss']:.5f}, grad norm {m['grad_norm']:.3f}"
        )
    steady = times[1:] or times
    step_s = sum(steady) / len(steady)
    tok_s = packed / step_s
    mfu = 6 * n_params * tok_s / (args.peak_tflops * 1e12)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    print(f"model {n_params / 1e6:.0f}M parameters ({args.shape}), full fp32 training state "
          f"{state_bytes / 2**30:.2f} GiB; batch {len(rollouts)} rollouts, {packed} packed tokens")  # fmt: skip
    print(f"{args.precision} on {device}: {step_s:.3f} s a step (mean of steps 2..), "
          f"{tok_s:,.0f} tokens/s, MFU {mfu:.3f} (peak {args.peak_tflops:g} TFLOPS), "
          f"peak device memory {peak:.2f} GiB")  # fmt: skip
    return first_loss


def cpu_reference_loss(conf, rollouts) -> float:  # type: ignore[no-untyped-def]
    trainer = bench_trainer(build_model(conf, seed=0, attn_implementation="sdpa"), "dense")
    return trainer.step(rollouts)["loss"]


def tree_vs_linear(conf, device: torch.device, rollouts) -> None:  # type: ignore[no-untyped-def]
    trees = list(build_trees(rollouts).values())
    stats = tree_stats(trees)
    tree_attn, impl = (
        ("flex_attention", "flex") if device.type == "cuda" else ("gyre_tree", "sparse")
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tree_model = build_model(conf, dtype=dtype, attn_implementation=tree_attn).to(device)
    lin_model = build_model(conf, dtype=dtype, attn_implementation="sdpa").to(device)
    from gyre_core.trajectory.pack import pack_trees

    samples = pack_trees(trees, 8192)
    branches = [b for t in trees for b in branch_sequences(t, assign_weights(t, mode="once"))]
    tree_pass(tree_model, samples[:1], impl)  # warm-up (flex compiles its kernel)
    linear_pass(lin_model, branches[:1])
    _sync(device)
    t_tree = tree_pass(tree_model, samples, impl)
    _sync(device)
    t_lin = linear_pass(lin_model, branches)
    _sync(device)
    speed = t_lin / t_tree
    dedup = stats["dedup_vs_branch"]
    print(f"tree-packed ({impl}) {t_tree:.3f} s vs per-branch linear {t_lin:.3f} s: "
          f"{speed:.2f}x; dedup vs branch {dedup:.2f}, ratio {speed / dedup:.2f} of it")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="the tiny shape on the CPU")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    ap.add_argument("--vocab", type=int, default=32_768)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument(
        "--peak-tflops", type=float, default=989.0, help="the device's bf16 dense peak (H200: 989)"
    )
    ap.add_argument("--no-reference", action="store_true", help="skip the fp32 CPU loss")
    args = ap.parse_args()
    if args.quick:
        args.shape, args.vocab, args.steps, args.precision = "tiny", 512, 2, "fp32"
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    conf = model_config(args.shape, args.vocab)
    rollouts = agentic_batch(args.vocab, args.quick)
    print(f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""))  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device.type == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        loss = sharded_steps(args, conf, device, rollouts)
    finally:
        dist.destroy_process_group()
    if not args.no_reference:
        ref = cpu_reference_loss(conf, rollouts)
        print(f"first-step loss: {args.precision} on {device} {loss:.6f}, fp32 on cpu {ref:.6f}, "
              f"relative difference {abs(loss - ref) / max(abs(ref), 1e-12):.2e}")  # fmt: skip
    tree_vs_linear(conf, device, rollouts)


if __name__ == "__main__":
    main()
