"""Decode throughput of TorchEngine vs plain transformers ``generate()`` on a small Qwen3.

Run: ``.venv/bin/python benchmarks/engine_bench.py [--new-tokens 64] [--batch 16]``.
Prompts are random token ids of different lengths; every request generates exactly
``--new-tokens`` tokens greedily (no stop tokens), so the work compared is the same.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.torch_engine import TorchEngine

VOCAB = 4096


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (16 + 8 * (i % 5),), generator=g).tolist() for i in range(n)]


def bench_engine(model: torch.nn.Module, prompts: list[list[int]], new: int, batch: int) -> float:
    params = SamplingParams(max_tokens=new, temperature=0.0)

    async def run() -> int:
        eng = TorchEngine(model, max_batch=batch)
        outs = await asyncio.gather(
            *(eng.generate(p, params, request_id=str(i)) for i, p in enumerate(prompts))
        )
        return sum(len(o.token_ids) for o in outs)

    t = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens / (time.perf_counter() - t)


def bench_hf_one_at_a_time(model: torch.nn.Module, prompts: list[list[int]], new: int) -> float:
    tokens = 0
    t = time.perf_counter()
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
            eos_token_id=None,
        )
        tokens += out.shape[1] - len(p)
    return tokens / (time.perf_counter() - t)


def bench_hf_batched(model: torch.nn.Module, prompts: list[list[int]], new: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t = time.perf_counter()
    out = model.generate(  # type: ignore[operator]
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        pad_token_id=0,
        eos_token_id=None,
    )
    return (out.shape[1] - width) * len(prompts) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="a smoke run: batch 4, 16 new tokens")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.new_tokens = 4, 16
    model = build_model(tiny_qwen3_config(ModelShape(VOCAB, max_positions=4096))).eval()
    prompts = _prompts(args.batch)
    new = args.new_tokens
    with torch.inference_mode():
        bench_engine(model, prompts[:2], 4, 2)  # warm-up
        print(f"Qwen3 4 layers hidden 256 vocab {VOCAB}, {torch.get_num_threads()} threads")
        print(f"{len(prompts)} requests x {new} new tokens, prompts 16-48 tokens")
        rows = [
            ("hf generate, one request at a time", bench_hf_one_at_a_time(model, prompts, new)),
            (
                f"hf generate, batch {len(prompts)} left-padded",
                bench_hf_batched(model, prompts, new),
            ),
            ("TorchEngine max_batch=1", bench_engine(model, prompts, new, 1)),
            (f"TorchEngine max_batch={args.batch}", bench_engine(model, prompts, new, args.batch)),
        ]
    for name, tps in rows:
        print(f"  {name:<40} {tps:8.1f} tok/s")


if __name__ == "__main__":
    main()
