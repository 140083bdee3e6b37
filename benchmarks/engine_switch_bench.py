"""A vLLM unit leaving rollout and coming back (``engine.on_leave``): stop and start a new
server, against sleep and wake the same one (then the current weights in buckets).

One ``VLLMUnit`` per mode on the same small checkpoint: start, one greedy request, then
``--cycles`` times leave (``stop``) and come back (``start`` with new weights), each return
followed by a request that must carry the new version. Prints the seconds of each part as
the unit's ``parts`` report them (what ``role_change`` events carry).

    .venv/bin/python benchmarks/engine_switch_bench.py [--cycles 2]

Needs the vllm venv (``python -m gyre_core.rollout.vllm_env ensure``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.weight_sync_bench import SHAPES
from gyre_core.models.init import init_checkpoint
from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.vllm_env import REPO_ROOT
from gyre_core.rollout.vllm_settings import VLLMSettings
from gyre_core.rollout.vllm_unit import VLLMUnit

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


async def _mode(ckpt: Path, work: Path, sleep: bool, cycles: int) -> dict[str, list[float]]:
    unit = VLLMUnit(0, ckpt, work, VLLMSettings(max_model_len=1024, sleep=sleep))
    base = load_file(str(ckpt / "model.safetensors"))
    parts: dict[str, list[float]] = {}
    try:
        engine = await unit.start(None, 0, 8)
        await engine.generate([5, 6, 7], GREEDY, request_id="warm")
        for k in range(1, cycles + 1):
            await unit.stop()
            left = dict(unit.parts)
            state = {n: v + 1e-3 * k for n, v in base.items()}
            engine = await unit.start(state, k, 8)
            out = await engine.generate([5, 6, 7], GREEDY, request_id=f"r{k}")
            assert out.versions == [k] * GREEDY.max_tokens
            for name, s in {**left, **unit.parts}.items():
                parts.setdefault(name, []).append(s)
        assert unit.started == (1 if sleep else cycles + 1)
    finally:
        await unit.shutdown()
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2, help="leave-and-return cycles per mode")
    args = ap.parse_args()
    work = REPO_ROOT / ".data" / "vllm" / "switch-bench"
    shutil.rmtree(work, ignore_errors=True)
    torch.manual_seed(0)
    ckpt = init_checkpoint(work / "ckpt", SHAPES["quick"])
    try:
        for sleep in (False, True):
            parts = asyncio.run(
                _mode(ckpt, work / ("sleep" if sleep else "stop"), sleep, args.cycles)
            )
            text = ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in parts.items())
            total = sum(statistics.median(v) for v in parts.values())
            print(
                f"on_leave {'sleep' if sleep else 'stop '}: {text}; a leave and return {total:.2f} s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
