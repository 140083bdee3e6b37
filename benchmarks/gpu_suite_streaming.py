"""The device check's streaming section (``benchmarks/gpu_suite.py``): the core of a
streaming world (``gyre_core/train/streaming.py``) on the device, alone in a one-process
group (NCCL on CUDA, gloo on the CPU). One GPU holds one rank, so the satellites' joins
are the CPU tests' (``tests/train/test_streaming.py``); what the GPU adds is checked here:

* a step opened on its first micro-steps, fed the rest by another thread and sealed, ends
  with the plain trainer's parameters (``rel_diff``, fp32 on both);
* parking the core: AdamW's state to pinned host memory and the model off the device
  (``offload_s``), back (``restore_s``), bit for bit, each tensor where AdamW keeps it
  (the moments on the device, the ``step`` count on the host unless fused);
* the streaming step's time against the plain one's (``stream_s``, ``plain_s``)."""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any

import torch

from benchmarks.gpu_suite_common import bench_trainer, sync
from benchmarks.gpu_suite_sections import Context, batch, build_on, process_group
from gyre_core.train.collectives import adamw_step
from gyre_core.train.losses import count_fresh
from gyre_core.train.streaming import StreamStep, offload_optimizer, restore_optimizer


def streaming_core(ctx: Context, shape: str) -> dict[str, Any]:
    """The streaming core's step, park and unpark on ``ctx.device`` (see the module)."""
    rollouts = batch(ctx)
    with process_group(ctx.device), tempfile.TemporaryDirectory() as folder:
        tokens = 128 if ctx.quick else 512  # a micro-step's most tokens: several a batch
        plain = bench_trainer(build_on(ctx.device, shape, ctx.vocab, "dense"), "dense", tokens)
        samples = plain.prepare(rollouts, 0)
        t0 = time.perf_counter()
        plain.step(rollouts, current_version=0)
        sync(ctx.device)
        plain_s = time.perf_counter() - t0
        want = {n: p.detach().to("cpu") for n, p in plain.model.named_parameters()}
        del plain
        core = bench_trainer(build_on(ctx.device, shape, ctx.vocab, "dense"), "dense", tokens)
        stream = StreamStep(core, torch.distributed.HashStore(), {}, folder)
        total = count_fresh(samples, 0, core.staleness_bound)

        def feed() -> None:  # the groups that finish while the step runs
            for sample in samples[1:]:
                stream.feed(0, [sample])
            stream.seal(0, total)

        t0 = time.perf_counter()
        stream.open(0, samples[:1])
        feeder = threading.Thread(target=feed)
        feeder.start()
        metrics = stream.finish(0)
        feeder.join()
        sync(ctx.device)
        stream_s = time.perf_counter() - t0
        worst = max(
            _relative(p.detach().to("cpu"), want[n]) for n, p in core.model.named_parameters()
        )
        before = [{k: v.clone() for k, v in s.items()} for s in core.optimizer.state.values()]
        t0 = time.perf_counter()
        host = offload_optimizer(core)
        core.model.to("cpu")
        sync(ctx.device)
        offload_s = time.perf_counter() - t0
        pinned = all(v.is_pinned() for s in host.values() for v in s.values()) if ctx.cuda else None
        t0 = time.perf_counter()
        core.model.to(ctx.device)
        restore_optimizer(core, host)
        sync(ctx.device)
        restore_s = time.perf_counter() - t0
        after = list(core.optimizer.state.values())
        exact = len(after) == len(before) and all(
            torch.equal(a[k].cpu(), v.cpu()) for a, b in zip(after, before, strict=True)
            for k, v in b.items()
        )  # fmt: skip
        step_on = adamw_step(core.params[0][1], core.optimizer.defaults).device
        placed = all(
            a[k].device == (step_on if k == "step" else ctx.device) for a in after for k in a
        )
    out = {
        "shape": shape, "micro_steps": len(samples), "members": metrics["members"],
        "rel_diff": worst, "stream_s": round(stream_s, 4), "plain_s": round(plain_s, 4),
        "offload_s": round(offload_s, 4), "restore_s": round(restore_s, 4),
        "exact": exact, "placed": placed, "pinned": pinned,
    }  # fmt: skip
    if worst > 1e-4 or not exact or not placed or pinned is False:
        out.update(
            ok=False, error=f"rel_diff {worst:.2e}, exact {exact}, placed {placed}, pinned {pinned}"
        )
    return out


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))
