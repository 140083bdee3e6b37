"""The device check's training sections (``benchmarks/gpu_suite.py``): a sharded training
step, bf16 against fp32, tree-packed against per-branch linear. Each returns its figures
as a dict (one JSON line); an exception fails its section only."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.gpu_suite_common import (
    QUICK_BATCH,
    agentic_batch,
    bench_trainer,
    model_config,
    step_flops,
    sync,
)
from benchmarks.trajectory_bench import branch_sequences
from gyre_core.models.model import build_model
from gyre_core.train.losses import count_fresh
from gyre_core.train.memory import chunked_logprobs, tree_logprobs
from gyre_core.train.sharded import ShardedTrainer, unit_mesh
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.synth import PRESETS, synth_rollouts
from gyre_core.trajectory.tree import build_trees

ATTENTION = {"dense": "sdpa", "flex": "flex_attention", "sparse": "gyre_tree"}
GIB = 2**30


@dataclass(frozen=True)
class Context:
    """What every section reads: the device, the run's sizes, the quick flag."""

    device: torch.device
    quick: bool
    vocab: int
    groups: int  # GRPO groups of the training batch
    steps: int  # timed training steps (after one warm-up step)
    peak: float | None  # the device's bf16 dense peak TFLOPS (None: unknown)
    bucket_bytes: int  # the weight hand-over's bucket size
    timeout: float  # seconds to await the hand-over's receiver

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def tree_impl(self) -> str:
        """The block-sparse tree path: flex on CUDA; on the CPU (no flex backward) Gyre's
        own sparse kernel."""
        return "flex" if self.cuda else "sparse"

    @property
    def precision(self) -> str:
        return "bf16" if self.cuda else "fp32"


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[None]:
    """A one-process group for the section (NCCL on CUDA, gloo on the CPU), destroyed after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def build_on(device: torch.device, shape: str, vocab: int, impl: str, **kw: Any) -> Any:
    """A random Qwen3 of ``shape``, initialised on ``device`` itself (seed 0 by default)."""
    with torch.device(device):
        return build_model(model_config(shape, vocab), attn_implementation=ATTENTION[impl], **kw)


def graphs_compiled() -> int:
    """Graphs torch.compile has made in this process so far (flex attention's kernels)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / GIB, 2)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def batch(ctx: Context) -> list[Rollout]:
    """The training batch: ``ctx.groups`` GRPO groups of the agentic batch (quick: one small
    group of 4 rollouts, about 1,000 tokens)."""
    if ctx.quick:
        return list(synth_rollouts(replace(QUICK_BATCH, vocab_size=ctx.vocab)))
    return agentic_batch(ctx.vocab, quick=False, groups=ctx.groups)


def train_step(ctx: Context, shape: str, impl: str) -> dict[str, Any]:
    """One training unit of one process (``ShardedTrainer``: FSDP2, ``ctx.precision``) on the
    agentic batch: a warm-up step (flex compiles there), then ``ctx.steps`` timed ones."""
    rollouts = batch(ctx)
    with process_group(ctx.device):
        model = build_on(ctx.device, shape, ctx.vocab, impl)
        params = sum(p.numel() for p in model.parameters())
        conf = model.config
        trainer = ShardedTrainer(
            bench_trainer(model, impl, precision=ctx.precision), unit_mesh(1, 1, ctx.device.type)
        )
        del model
        samples = trainer.trainer.prepare(rollouts, 0)
        trained = count_fresh(samples, 0, trainer.trainer.staleness_bound)
        t0 = time.perf_counter()
        first = trainer.step(rollouts, current_version=0)
        sync(ctx.device)
        warmup_s = time.perf_counter() - t0
        reset_peak(ctx.device)
        graphs, times = graphs_compiled(), []
        for _ in range(ctx.steps):
            t0 = time.perf_counter()
            last = trainer.step(rollouts, current_version=0)  # the same work every step
            sync(ctx.device)
            times.append(time.perf_counter() - t0)
        compiled = graphs_compiled() - graphs
    step_s = statistics.mean(times)
    flops = step_flops(conf, samples, trained, params)
    out = {
        "shape": shape, "attention": impl, "precision": ctx.precision, "params": params,
        "samples": len(samples), "packed_tokens": sum(len(s) for s in samples),
        "trained_tokens": trained, "warmup_s": round(warmup_s, 3),
        "step_s": round(step_s, 4), "steps_s": [round(t, 4) for t in times],
        "tokens_per_s": round(sum(len(s) for s in samples) / step_s, 1),
        "trained_tokens_per_s": round(trained / step_s, 1),
        "model_tflop_per_step": round(flops.model / 1e12, 3),
        "achieved_tflops": round(flops.model / step_s / 1e12, 2),
        "peak_tflops": ctx.peak,
        **mfu_figures(flops.model, flops.six_n, step_s, ctx.peak),
        "peak_mem_gib": peak_gib(ctx.device), "graphs_compiled_in_timed_steps": compiled,
        "loss_first": first["loss"], "loss_last": last["loss"], "grad_norm": last["grad_norm"],
    }  # fmt: skip
    if compiled:  # the figures above then time compilation too: the section fails
        out.update(ok=False, error=f"torch.compile made {compiled} graphs in the timed steps")
    return out


def mfu_figures(model: float, six_n: float, step_s: float, peak: float | None) -> dict[str, Any]:
    """MFU (matmuls + output head + attention, embedding lookup excluded) and the 6N figure
    beside it, each over the device's peak; None where the peak is unknown (the CPU)."""

    def frac(flops: float) -> float | None:
        return None if peak is None else round(flops / step_s / (peak * 1e12), 4)

    return {
        "mfu": frac(model),
        "mfu_basis": "decoder matmuls x packed tokens + output head x trained tokens + "
        "attention x (query, key) pairs in the tree masks; fwd+bwd = 3x fwd; no embedding",
        "mfu_6n": frac(six_n),
        "mfu_6n_basis": "6 x all parameters (embeddings included) x packed tokens, no attention",
    }


def precision_agreement(ctx: Context, shape: str) -> dict[str, Any]:
    """The first step's loss at bf16 (FSDP2 mixed precision) against fp32, same batch and
    weights, dense tree mask. ``train.loss=pg`` (-A logp): the loss depends on every
    trained token's log-prob, where PPO's clip would hide most of them."""
    rollouts = batch(ctx)
    got = {}
    for precision in ("bf16", "fp32"):
        with process_group(ctx.device):
            model = build_on(ctx.device, shape, ctx.vocab, "dense")
            trainer = ShardedTrainer(
                bench_trainer(model, "dense", precision=precision, loss="pg"),
                unit_mesh(1, 1, ctx.device.type),
            )
            del model
            got[precision] = trainer.step(rollouts, current_version=0)
            del trainer
    bf, fp = got["bf16"]["loss"], got["fp32"]["loss"]
    return {
        "shape": shape, "attention": "dense", "loss": "pg",
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if ctx.cuda else None,
        "loss_bf16": bf, "loss_fp32": fp, "abs_diff": abs(bf - fp),
        "rel_diff": abs(bf - fp) / max(abs(fp), 1e-12),
        "entropy_bf16": got["bf16"]["entropy"], "entropy_fp32": got["fp32"]["entropy"],
        "grad_norm_bf16": got["bf16"]["grad_norm"], "grad_norm_fp32": got["fp32"]["grad_norm"],
    }  # fmt: skip


def tree_pass(model: Any, samples: list[PackedSample], impl: str) -> float:
    """Forward and backward of each packed sample (the trained tokens' log-probs, projected
    in chunks as the trainer does); the seconds, synchronised."""
    dev = model.device
    sync(dev)
    t0 = time.perf_counter()
    for s in samples:
        ids, pos, parent = (torch.from_numpy(a).to(dev) for a in (s.input_ids, s.position_ids, s.parent))  # fmt: skip
        rows = torch.from_numpy(np.flatnonzero(s.trainable)).to(dev)
        lp, _ = tree_logprobs(model, ids, pos, parent, rows, impl, chunk=1024, entropy=False)  # type: ignore[arg-type]
        torch.autograd.backward(-lp.mean())
    sync(dev)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def linear_pass(model: Any, branches: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The same for each rollout branch as its own causal sequence (no mask: SDPA's causal
    kernels), its rollout's generated tokens trained."""
    dev, head = model.device, model.get_output_embeddings()
    sync(dev)
    t0 = time.perf_counter()
    for ids, w in branches:
        x = torch.from_numpy(ids).to(dev)
        rows = torch.from_numpy(np.flatnonzero(w[1:]) + 1).to(dev)
        out = model(input_ids=x[None], use_cache=False, output_hidden_states=-1,
                    logits_to_keep=torch.empty(0, dtype=torch.long, device=dev))  # fmt: skip
        lp, _ = chunked_logprobs(head, out.hidden_states[-1][0][rows - 1], x[rows], 1024, entropy=False)  # fmt: skip
        torch.autograd.backward(-lp.mean())
    sync(dev)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def tree_vs_linear(ctx: Context, shape: str) -> dict[str, Any]:
    """One forward + backward over the ``agentic`` preset tree-packed against per-branch
    linear (quick: a cut-down agentic batch); goal: a speedup of at least 0.8 x the ratio
    of their token counts (per-branch tokens / packed tokens)."""
    if ctx.quick:
        rollouts, max_tokens = batch(ctx), 8192
    else:
        rollouts = list(synth_rollouts(replace(PRESETS["agentic"], vocab_size=ctx.vocab)))
        max_tokens = PRESETS["agentic"].max_context or 32_768
    trees = list(build_trees(rollouts).values())
    samples = pack_trees(trees, max_tokens)
    branches = [b for t in trees for b in branch_sequences(t, [1.0] * len(t.rollouts))]
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    tree_model = build_on(ctx.device, shape, ctx.vocab, ctx.tree_impl, dtype=dtype)
    lin_model = build_on(ctx.device, shape, ctx.vocab, "dense", dtype=dtype)
    tree_model.train(), lin_model.train()  # as the trainer runs them (flex compiles per mode)
    warm = tree_pass(tree_model, samples, ctx.tree_impl)  # flex compiles here
    warm += linear_pass(lin_model, branches[:2])
    reset_peak(ctx.device)
    graphs = graphs_compiled()
    t_tree = tree_pass(tree_model, samples, ctx.tree_impl)
    t_lin = linear_pass(lin_model, branches)
    compiled = graphs_compiled() - graphs
    packed, linear = sum(len(s) for s in samples), sum(len(b[0]) for b in branches)
    ratio, speedup = linear / packed, t_lin / t_tree
    out = {
        "preset": "agentic (cut down)" if ctx.quick else "agentic", "shape": shape,
        "attention": ctx.tree_impl, "dtype": str(dtype).removeprefix("torch."),
        "max_tokens": max_tokens, "samples": len(samples), "branches": len(branches),
        "tree_tokens": packed, "linear_tokens": linear, "warmup_s": round(warm, 3),
        "tree_s": round(t_tree, 3), "linear_s": round(t_lin, 3),
        "tree_tokens_per_s": round(packed / t_tree, 1),
        "linear_tokens_per_s": round(linear / t_lin, 1),
        "dedup_ratio": round(ratio, 3), "speedup": round(speedup, 3),
        "speedup_over_dedup": round(speedup / ratio, 3), "goal": 0.8,
        "goal_met": speedup >= 0.8 * ratio, "peak_mem_gib": peak_gib(ctx.device),
        "graphs_compiled_in_timed_pass": compiled,
    }  # fmt: skip
    if compiled:
        out.update(ok=False, error=f"torch.compile made {compiled} graphs in the timed pass")
    return out
