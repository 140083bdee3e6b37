"""What the OpenAI-compatible endpoint adds to a call over the in-process router.

``S`` sessions at once each make ``--calls`` chat calls on a growing conversation (every
call sends the whole conversation back, with one new user message). Two paths, the same
engine and the same recorder:

* **in-process**: render and match the messages (``ChatSession.prompt``), ``router.generate``,
  record the call, as code inside the run would;
* **endpoint**: the official ``openai`` client (``AsyncOpenAI``) in another process, over
  HTTP to ``Endpoint``, which does the same and answers in JSON.

The engine answers at once with a fixed completion (``--tokens`` ids, no model), so the
figures are the paths' own cost, not decoding's. Printed per path and concurrency: calls/s
and the p50 and p90 of a call's latency; then what the endpoint adds at the median, and the
median time its handler spends on a call (parse, match, route, record, reply): the rest is
HTTP and the ``openai`` client's own work, in the one process that drives every session.

    python benchmarks/endpoint_bench.py                  # 1 and 32 sessions, 50 calls each
    python benchmarks/endpoint_bench.py --quick          # 1 and 8 sessions, 10 calls each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer
from gyre_core.rollout.chat import ChatFormat, check_messages
from gyre_core.rollout.chat_session import ChatSession
from gyre_core.rollout.endpoint import Endpoint
from gyre_core.rollout.engine import Completion, EngineLoad, SamplingParams
from gyre_core.rollout.router import Router

SYSTEM = "You are a careful agent. " * 20
TURN = "Observation: the tests ran; 3 of 5 passed. Go on."


class InstantEngine:
    """An engine that answers every call at once with the same tokens (no model)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        await asyncio.sleep(0)
        n = min(len(self.ids), params.max_tokens)
        return Completion(self.ids[:n], [-0.1] * n, [0] * n, "stop", len(prompt_ids))

    async def abort(self, request_id: str) -> bool:
        return False

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def publish(self, state_dict_path: str, version: int) -> None: ...

    async def load(self) -> EngineLoad:
        return EngineLoad(0, 0)

    @property
    def version(self) -> int:
        return 0


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=10)
    return {"calls": len(latencies), "calls_per_s": len(latencies) / wall,
            "p50_ms": 1e3 * statistics.median(latencies), "p90_ms": 1e3 * q[8]}  # fmt: skip


async def in_process(
    fmt: ChatFormat, router: Router, sessions: int, calls: int
) -> dict[str, float]:
    lat: list[float] = []

    async def one(k: int) -> None:
        chat = ChatSession(f"r{k}", fmt)
        raw = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURN}]
        for _ in range(calls):
            t0 = time.perf_counter()
            prompt = chat.prompt(check_messages(raw))
            call_id, _ = chat.reserve()
            params = SamplingParams(max_tokens=64, temperature=1.0, stop_token_ids=fmt.stop_ids())
            out = await router.generate(
                chat.session_id, prompt.ids, params, request_id=f"r{k}/{call_id}"
            )
            content, _ = chat.record(call_id, prompt, out)
            lat.append(time.perf_counter() - t0)
            raw += [{"role": "assistant", "content": content}, {"role": "user", "content": TURN}]

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(sessions)))
    return summary(lat, time.perf_counter() - t0)


CLIENT = """
import asyncio, json, sys, time
from openai import AsyncOpenAI
urls, calls, system, turn = json.loads(sys.stdin.read())
lat = []
async def one(url):
    c = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": turn}]
    for _ in range(calls):
        t0 = time.perf_counter()
        r = await c.chat.completions.create(model="gyre-policy", messages=msgs)
        lat.append(time.perf_counter() - t0)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": turn}]
async def main():
    t0 = time.perf_counter()
    await asyncio.gather(*(one(u) for u in urls))
    print(json.dumps({"lat": lat, "wall": time.perf_counter() - t0}))
asyncio.run(main())
"""


class TimedEndpoint(Endpoint):
    """The endpoint, timing its own handling of each chat call (request in, reply out)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.handled: list[float] = []

    async def _chat(self, request: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await super()._chat(request)
        finally:
            self.handled.append(time.perf_counter() - t0)


async def through_endpoint(
    ep: TimedEndpoint, router: Router, sessions: int, calls: int
) -> dict[str, float]:
    ep.handled.clear()
    urls = [
        ep.open(f"e{k}", router, max_tokens=64, temperature=1.0, seed=k).base_url
        for k in range(sessions)
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate(json.dumps([urls, calls, SYSTEM, TURN]).encode())
    got = json.loads(out.decode().strip().splitlines()[-1])
    handled = 1e3 * statistics.median(ep.handled)
    return {**summary(got["lat"], got["wall"]), "handler_p50_ms": handled}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    tok = as_hf_tokenizer(train_tokenizer(default_corpus(), 1024))
    fmt = ChatFormat(tok)
    router = Router(
        {"e": InstantEngine(fmt.codec.encode("I will run the tests now.<|im_end|>")[: args.tokens])}
    )
    ep = TimedEndpoint(tok)
    await ep.start()
    rows = []
    try:
        for s in args.sessions:
            a = await in_process(fmt, router, s, args.calls)
            b = await through_endpoint(ep, router, s, args.calls)
            rows.append({"sessions": s, "in_process": a, "endpoint": b})
    finally:
        await ep.close()
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--calls", type=int, default=50, help="calls a session")
    ap.add_argument("--tokens", type=int, default=8, help="tokens a completion")
    ap.add_argument("--quick", action="store_true", help="1 and 8 sessions, 10 calls each")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions, args.calls = [1, 8], 10
    rows = asyncio.run(run(args))
    print("| sessions | path | calls/s | p50 ms | p90 ms |\n|---:|---|---:|---:|---:|")
    for r in rows:
        for path in ("in_process", "endpoint"):
            m = r[path]
            print(
                f"| {r['sessions']} | {path} | {m['calls_per_s']:.0f} | {m['p50_ms']:.2f} | {m['p90_ms']:.2f} |"
            )
    for r in rows:
        added = r["endpoint"]["p50_ms"] - r["in_process"]["p50_ms"]
        print(f"{r['sessions']} sessions: the endpoint adds {added:.2f} ms a call at the median; "
              f"its handler's own p50 {r['endpoint']['handler_p50_ms']:.2f} ms (the rest: HTTP and "
              f"the client's work in the agent's process)")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
