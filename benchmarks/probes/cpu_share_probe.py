"""How the CPU demo's units share a small machine's cores: total decode throughput of
``P`` processes, each a one-thread ``TorchEngine`` on the learning demo's model (built from
``configs/learn-elastic.yaml`` by the runtime's own ``make_model_dir``, loaded as a unit
loads it), that
between them serve a fixed number of concurrent requests -- with each process free to run
on any core, or pinned to one (``os.sched_setaffinity``, process ``i`` on core ``i mod
ncpu``).

Run: ``.venv/bin/python benchmarks/probes/cpu_share_probe.py [--requests 32] [--new-tokens 64]
[--procs 1,2,4] [--repeats 2]``. It separates two reasons a policy that keeps fewer units
busy could decode faster per unit on a 2-core machine: more requests in each engine's
batch (the tiny model's decode step costs little more at batch 16 than at 8), and fewer
processes than cores contending (no time slicing). Prints one row a configuration:
processes, pinned or not, requests a process, total and per-process tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "learn-elastic.yaml"


def _worker(model_dir: str, index: int, pin: bool, requests: int, new: int, start, out) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from gyre_core.rollout.engine import SamplingParams
    from gyre_core.rollout.torch_engine import TorchEngine

    torch.set_num_threads(1)
    if pin:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[index % len(cores)]})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(index)
    prompts = [
        torch.randint(0, vocab, (200 + 40 * (i % 5),), generator=g).tolist()
        for i in range(requests)
    ]
    params = SamplingParams(max_tokens=new, temperature=0.0)

    async def run(batch: list[list[int]]) -> int:
        eng = TorchEngine(model, max_batch=max(1, len(batch)))
        outs = await asyncio.gather(
            *(eng.generate(p, params, request_id=str(i)) for i, p in enumerate(batch))
        )
        return sum(len(o.token_ids) for o in outs)

    with torch.inference_mode():
        asyncio.run(run(prompts[:2]))  # warm-up
        start.wait()
        t0 = time.perf_counter()
        tokens = asyncio.run(run(prompts))
        out.put((tokens, time.perf_counter() - t0))


def measure(model_dir: str, procs: int, pin: bool, requests: int, new: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs + 1), ctx.Queue()
    each = requests // procs
    ps = [
        ctx.Process(target=_worker, args=(model_dir, i, pin, each, new, start, out))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    results = [out.get() for _ in ps]
    wall = time.perf_counter() - t0
    for p in ps:
        p.join()
    tokens = sum(r[0] for r in results)
    return tokens / wall, sum(r[0] / r[1] for r in results) / procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.procs.split(",")]
    except ValueError:
        raise SystemExit(f"--procs: want counts like 1,2,4, got {args.procs!r}") from None
    if any(c < 1 or args.requests % c for c in counts):
        raise SystemExit(
            f"--procs: each count must be >= 1 and divide --requests ({args.requests})"
        )
    from gyre_core.config import load_config
    from gyre_core.runtime.session import make_model_dir

    cfg = load_config(CONFIG)
    model_dir = str(make_model_dir(cfg, Path(tempfile.mkdtemp(prefix="gyre-probe-"))))
    m = cfg.model
    print(f"cores {len(os.sched_getaffinity(0))}; {args.requests} requests x "
          f"{args.new_tokens} new tokens; model of {CONFIG.name}: {m.layers} layers, "
          f"hidden {m.hidden_size}")  # fmt: skip
    print(f"{'procs':>5} {'pinned':>6} {'req/proc':>8} {'total tok/s':>12} {'per proc':>9}")
    for procs in counts:
        for pin in (False, True):
            runs = [
                measure(model_dir, procs, pin, args.requests, args.new_tokens)
                for _ in range(args.repeats)
            ]
            total = max(r[0] for r in runs)
            per = max(r[1] for r in runs)
            print(f"{procs:>5} {pin!s:>6} {args.requests // procs:>8} {total:>12.0f} {per:>9.0f}")


if __name__ == "__main__":
    main()
