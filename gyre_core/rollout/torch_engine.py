"""``TorchEngine``: an in-process :class:`~gyre_core.rollout.engine.Engine` on a transformers LM.

Design (continuous batching over one left-padded KV cache)
---------------------------------------------------------
* One background asyncio task (started lazily by the first ``generate`` on a running loop)
  repeats *iterations*. Each iteration, under a step lock and in a worker thread (so the
  event loop stays free for ``abort``/``pause``/``publish`` callers):

  1. **admit**: up to ``max_batch - running`` waiting requests are prefilled one at a time
     (batch 1, no padding, ``logits_to_keep=1``), each producing its own ``DynamicCache``
     and its first sampled token;
  2. **merge**: if anything was admitted, the running batch cache and the new caches are
     re-laid into one ``DynamicCache`` of width ``max(length)``, every row *right-aligned*
     (left-padded) with a 2-D attention mask marking real slots;
  3. **decode**: one batched forward of the running sequences' last tokens against that
     cache, with explicit per-row ``position_ids`` (each row's true length), so rotary
     positions and the causal/padding mask are exactly what a lone sequence sees. The
     cache grows in place (transformers' ``DynamicLayer`` concatenation);
  4. **retire**: finished rows (stop token, ``max_tokens``, abort) are dropped with
     ``index_select`` and all-padding columns at the left are trimmed.

  The cache is re-laid only when requests are admitted, not every step, so steady-state
  decode costs one batched forward per token for the whole batch.

* **Sampling** happens per row on CPU float32 logits: greedy (``argmax``) at temperature 0,
  otherwise temperature scaling, then top-p (nucleus) filtering, then inverse-CDF sampling
  with one uniform draw per token that depends only on ``SamplingParams.seed`` (or a fresh
  random seed) and the token's absolute position in the sequence (:func:`position_uniform`).
  A call that migrates continues on another engine as ``prompt + tokens kept``, so its later
  tokens get exactly the draws they would have had on the first engine: with the same weights
  a migrated call samples the very tokens an unmoved one does, and under other weights the
  same draw picks the same token unless the probabilities moved across it (two runs whose
  policies differ a little sample nearly the same rollouts).
  The recorded **behaviour logprob** is ``log_softmax`` of the model's raw logits at
  temperature 1 with no top-p shaping -- the quantity the trainer recomputes -- not the
  probability under the shaped sampling distribution.
* **Stop tokens** are included in ``token_ids`` (with their logprob), finish_reason ``"stop"``;
  reaching ``max_tokens`` gives ``"length"``; ``abort`` gives ``"abort"`` and the tokens so far.
* **Versions**: each token carries the engine version at the step that sampled it.
  ``publish`` takes the step lock, so weights change only between steps; KV already cached
  for in-flight requests is kept (computed by the old weights), as vLLM's ``keep`` mode does.
* ``pause`` stops stepping after the current step; requests keep their cache and state.
* ``score`` (teacher forcing) runs one uncached forward over prompt + given completion under
  the step lock, between decode steps, and returns the completion's temperature-1 logprobs
  tagged with the version at that moment; it waits while the engine is paused.

Not handled: batched prefill, prefix caching, memory limits (the cache grows without
bound), and engines shared across event loops (a new loop restarts the background task;
requests submitted on a dead loop are dropped).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import DynamicCache, PreTrainedConfig

from gyre_core.rollout.engine import Completion, EngineLoad, SamplingParams


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    seed: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    length: int = 0  # tokens whose keys/values are in the cache
    finish_reason: str | None = None


class TorchEngine:
    """Continuous-batching engine over a transformers causal LM (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        version: int = 0,
        max_batch: int = 16,
        device: str | torch.device = "cpu",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._device = torch.device(device)
        torch.nn.Module.to(model, self._device)
        model.eval()
        self._model = model
        config = model.config
        if not isinstance(config, PreTrainedConfig):
            raise TypeError("model must be a transformers model (with a PreTrainedConfig)")
        self._config = config
        self._version = version
        self._max_batch = max_batch
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._done: list[_Request] = []  # finished in a worker thread, not yet resolved
        self._by_id: dict[str, _Request] = {}
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # [running, cache width], 1 = real slot
        self._paused = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ Engine protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if request_id in self._by_id:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        self._ensure_loop()
        assert self._loop is not None and self._wake is not None
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        req = _Request(request_id, list(prompt_ids), params, self._loop.create_future(), seed)
        self._waiting.append(req)
        self._by_id[request_id] = req
        self._wake.set()
        return await req.future

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], *, request_id: str
    ) -> Completion:
        """Teacher forcing: the policy's logprobs of ``completion_ids`` after ``prompt_ids``
        (one forward pass over both, between decode steps; waits while paused)."""
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        while self._paused:  # a paused engine computes nothing; resume() clears the flag
            await asyncio.sleep(0.01)
        async with self._get_lock():
            version = self._version
            logprobs = await asyncio.to_thread(self._score, list(prompt_ids), list(completion_ids))
        n = len(completion_ids)
        return Completion(list(completion_ids), logprobs, [version] * n, "forced", len(prompt_ids))

    def tokens_so_far(self, request_id: str) -> int:
        """Tokens generated so far for an in-flight request (0 if unknown)."""
        req = self._by_id.get(request_id)
        return len(req.token_ids) if req is not None else 0

    async def abort(self, request_id: str) -> bool:
        req = self._by_id.get(request_id)
        if req is None:
            return False
        async with self._get_lock():
            if req.finish_reason is not None or request_id not in self._by_id:
                return False
            req.finish_reason = "abort"
            if req in self._waiting:
                self._waiting.remove(req)
                self._finish(req)
            else:
                self._retire()
        return True

    async def pause(self) -> None:
        # Taking the lock waits for an in-flight step; the loop checks the flag before the next.
        async with self._get_lock():
            self._paused = True

    async def resume(self) -> None:
        self._paused = False
        if self._wake is not None:
            self._wake.set()

    async def publish(self, state_dict_path: str | dict[str, torch.Tensor], version: int) -> None:
        """Swap in new weights (a checkpoint directory of safetensors, or a state dict)
        between steps; tokens sampled afterwards carry ``version``."""
        state = (
            await asyncio.to_thread(load_weights_dir, state_dict_path)
            if isinstance(state_dict_path, str | Path)
            else state_dict_path
        )
        async with self._get_lock():
            await asyncio.to_thread(self._load_state, state)
            self._version = version

    async def load(self) -> EngineLoad:
        return EngineLoad(running=len(self._running), waiting=len(self._waiting))

    def close(self) -> None:
        """Ends the background loop (an engine made for one job: nothing must be waiting)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # ------------------------------------------------------------------ background loop

    def _get_lock(self) -> asyncio.Lock:
        self._ensure_loop()
        assert self._lock is not None
        return self._lock

    def _ensure_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        if self._loop is not loop:
            # A new event loop: state tied to the old one cannot be resumed.
            self._waiting.clear()
            self._running.clear()
            self._done.clear()
            self._by_id.clear()
            self._cache = None
            self._mask = None
            self._loop = loop
            self._wake = asyncio.Event()
            self._lock = asyncio.Lock()
        self._task = loop.create_task(self._run(), name="torch-engine")

    async def _run(self) -> None:
        assert self._wake is not None and self._lock is not None
        while True:
            if self._paused or not (self._waiting or self._running):
                self._wake.clear()
                await self._wake.wait()
                continue
            async with self._lock:
                if self._paused:
                    continue
                version = self._version
                await asyncio.to_thread(self._iterate, version)
                self._retire()
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ one iteration

    @torch.inference_mode()
    def _iterate(self, version: int) -> None:
        admitted: list[tuple[_Request, DynamicCache]] = []
        while self._waiting and len(self._running) + len(admitted) < self._max_batch:
            req = self._waiting.popleft()
            admitted.append((req, self._prefill(req, version)))
        if admitted:
            self._merge(admitted)
        live = [i for i, r in enumerate(self._running) if r.finish_reason is None]
        if len(live) < len(self._running):
            # Rows finished by their first token: drop before the decode step.
            self._retire_rows(live)
        if self._running:
            self._decode(version)

    @torch.inference_mode()
    def _score(self, prompt: list[int], completion: list[int]) -> list[float]:
        if not completion:
            return []
        ids = torch.tensor([prompt + completion], dtype=torch.long, device=self._device)
        # logits at positions len(prompt)-1 .. end-1 predict the completion's tokens
        out = self._model(input_ids=ids, use_cache=False, logits_to_keep=len(completion) + 1)
        logp = torch.log_softmax(out.logits[0, :-1].float().cpu(), dim=-1)
        target = torch.tensor(completion, dtype=torch.long)
        return [float(x) for x in logp.gather(1, target[:, None])[:, 0]]

    def _prefill(self, req: _Request, version: int) -> DynamicCache:
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=self._device)
        cache = DynamicCache(config=self._config)
        out = self._model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        req.length = len(req.prompt_ids)
        self._emit(req, out.logits[0, -1], version)
        return cache

    def _merge(self, admitted: list[tuple[_Request, DynamicCache]]) -> None:
        reqs = self._running + [r for r, _ in admitted]
        width = max(r.length for r in reqs)
        n_old = len(self._running)
        mask = torch.zeros(len(reqs), width, dtype=torch.long, device=self._device)
        if self._mask is not None and n_old:
            mask[:n_old, width - self._mask.shape[1] :] = self._mask
        for j, (r, _) in enumerate(admitted):
            mask[n_old + j, width - r.length :] = 1
        merged = DynamicCache(config=self._config)
        n_layers = len(admitted[0][1].layers)
        for layer in range(n_layers):
            parts_k: list[torch.Tensor] = []
            parts_v: list[torch.Tensor] = []
            if self._cache is not None and n_old:
                k, v = _kv(self._cache, layer)
                parts_k.append(_left_pad(k, width))
                parts_v.append(_left_pad(v, width))
            for _, c in admitted:
                k, v = _kv(c, layer)
                parts_k.append(_left_pad(k, width))
                parts_v.append(_left_pad(v, width))
            merged.update(torch.cat(parts_k), torch.cat(parts_v), layer)
        self._running = reqs
        self._cache = merged
        self._mask = mask

    def _decode(self, version: int) -> None:
        assert self._cache is not None and self._mask is not None
        rows = self._running
        ids = torch.tensor([[r.token_ids[-1]] for r in rows], dtype=torch.long)
        pos = torch.tensor([[r.length] for r in rows], dtype=torch.long)
        ones = torch.ones(len(rows), 1, dtype=torch.long, device=self._device)
        mask = torch.cat([self._mask, ones], dim=1)
        out = self._model(
            input_ids=ids.to(self._device),
            attention_mask=mask,
            position_ids=pos.to(self._device),
            past_key_values=self._cache,
            use_cache=True,
        )
        self._mask = mask
        logits = out.logits[:, -1]
        for i, r in enumerate(rows):
            r.length += 1
            self._emit(r, logits[i], version)

    def _emit(self, req: _Request, logits: torch.Tensor, version: int) -> None:
        """Sample the next token of ``req`` from ``logits`` and record it."""
        logits = logits.float().cpu()
        logp = torch.log_softmax(logits, dim=-1)
        p = req.params
        if p.temperature == 0:
            tok = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                # keep the smallest prefix whose mass reaches top_p (always the top token)
                drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= p.top_p
                sorted_p[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
            u = position_uniform(req.seed, len(req.prompt_ids) + len(req.token_ids))
            tok = _inverse_cdf(probs, u)
        req.token_ids.append(tok)
        req.logprobs.append(float(logp[tok]))
        req.versions.append(version)
        if tok in p.stop_token_ids:
            req.finish_reason = "stop"
        elif len(req.token_ids) >= p.max_tokens:
            req.finish_reason = "length"

    def _retire(self) -> None:
        """Drop finished rows from the batch and resolve their futures."""
        live = [i for i, r in enumerate(self._running) if r.finish_reason is None]
        if len(live) < len(self._running):
            self._retire_rows(live)
        done, self._done = self._done, []
        for r in done:
            self._finish(r)

    def _retire_rows(self, live: list[int]) -> None:
        """Drop finished rows; their futures are resolved later, on the loop thread."""
        self._done.extend(r for r in self._running if r.finish_reason is not None)
        self._running = [self._running[i] for i in live]
        if not live:
            self._cache = None
            self._mask = None
            return
        assert self._cache is not None and self._mask is not None
        idx = torch.tensor(live, dtype=torch.long, device=self._device)
        mask = self._mask.index_select(0, idx)
        # trim columns that are padding for every remaining row
        start = int((mask.sum(0) > 0).nonzero()[0])
        self._mask = mask[:, start:]
        for i, layer in enumerate(self._cache.layers):
            k, v = _kv(self._cache, i)
            layer.keys = k.index_select(0, idx)[:, :, start:]  # type: ignore[union-attr]
            layer.values = v.index_select(0, idx)[:, :, start:]  # type: ignore[union-attr]

    def _finish(self, req: _Request) -> None:
        self._by_id.pop(req.request_id, None)
        if req.future.done():
            return
        req.future.set_result(
            Completion(
                token_ids=list(req.token_ids),
                logprobs=list(req.logprobs),
                versions=list(req.versions),
                finish_reason=req.finish_reason or "abort",
                prompt_tokens=len(req.prompt_ids),
            )
        )

    def _load_state(self, state: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self._model.load_state_dict(state, strict=False)
        tied = set(getattr(self._model, "_tied_weights_keys", None) or ())
        if unexpected or any(k not in tied and k != "lm_head.weight" for k in missing):
            raise ValueError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
        tie: Any = getattr(self._model, "tie_weights", None)
        if missing and tie is not None:
            tie()


class TorchHost:
    """A unit's rollout role served in process (``model.engine: torch``, an
    :class:`~gyre_core.rollout.engine.EngineHost`): a ``TorchEngine`` on the checkpoint's
    model, with the weights it is given."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.engine: TorchEngine | None = None

    async def start(
        self, state: dict[str, Any] | None, version: int, max_batch: int
    ) -> TorchEngine:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32)
        if state is not None:
            model.load_state_dict(state, strict=False)
            model.tie_weights()
        self.engine = TorchEngine(model, version=version, max_batch=max_batch)
        return self.engine

    async def publish(self, state: dict[str, Any], version: int) -> None:
        if self.engine is not None:
            await self.engine.pause()
            await self.engine.publish(state, version)
            await self.engine.resume()

    async def stop(self) -> None:
        self.engine = None


def _kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of one layer of a (full-attention) dynamic cache."""
    lay: Any = cache.layers[layer]
    keys, values = lay.keys, lay.values
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError(f"cache layer {layer} holds no key/value tensors")
    return keys, values


def _left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pad ``x`` ([batch, heads, length, dim]) with zeros on the left to ``width`` slots."""
    pad = width - x.shape[-2]
    if pad == 0:
        return x
    return torch.nn.functional.pad(x, (0, 0, pad, 0))


def load_weights_dir(path: str | Path) -> dict[str, Any]:
    """Every tensor in the ``*.safetensors`` files of a checkpoint directory (or one file)."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {p}")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


_MASK64 = (1 << 64) - 1


def position_uniform(seed: int, position: int) -> float:
    """A uniform draw in [0, 1) for the token at ``position`` (0-based, prompt included) of
    a call seeded ``seed``: two rounds of splitmix64 over the pair, so neighbouring seeds and
    positions give unrelated draws. Pure: the same pair always gives the same draw."""
    x = (seed * 0x9E3779B97F4A7C15 + position) & _MASK64
    for _ in range(2):
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def _inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative-probability interval holds ``u`` (times the total); a
    token of probability 0 has an empty interval and is never chosen."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    idx = int(
        torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype), right=True)[0]
    )
    if idx >= cdf.numel():  # u * total rounded up to the total: the last token with mass
        idx = int(torch.nonzero(probs > 0)[-1, 0])
    return idx
