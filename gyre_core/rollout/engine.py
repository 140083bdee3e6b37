"""One interface for every inference engine Gyre drives (torch in-process, vLLM server);
the kinds a unit's rollout role can be served by (``model.engine``) are registered in
:mod:`gyre_core.rollout.engine_kinds`.

An engine turns token ids into token ids, recording for every generated token its
log-probability under the policy that sampled it and that policy's version, so training
can correct for staleness and the trajectory processor can build trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # per-request sampling seed (reproducible rollouts)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(slots=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # one per generated token, under the sampling policy
    versions: list[int]  # the policy version that generated each token
    finish_reason: str  # "stop", "length", "abort"; "forced" for a score (teacher forcing)
    prompt_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int  # sequences decoding now
    waiting: int  # requests queued for a slot


class Engine(Protocol):
    """What the router needs from an engine. Every method is a coroutine so that an
    engine behind HTTP and one in-process look the same to the harness."""

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion: ...

    async def abort(self, request_id: str) -> bool: ...

    async def pause(self) -> None:
        """Stop scheduling new tokens; in-flight requests keep their state (``keep``)."""

    async def resume(self) -> None: ...

    async def publish(self, state_dict_path: str, version: int) -> None:
        """Load new weights (a checkpoint directory) and tag later tokens with ``version``."""

    async def load(self) -> EngineLoad: ...

    @property
    def version(self) -> int: ...


@runtime_checkable
class ScoringEngine(Engine, Protocol):
    """An engine that can also *score* a given continuation (teacher forcing): the router
    sends a scripted agent's oracle text there so its logged calls carry the policy's real
    logprobs and version. ``TorchEngine`` and ``VLLMEngine`` are scoring engines."""

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], *, request_id: str
    ) -> Completion:
        """One forward pass over ``prompt_ids + completion_ids``: returns ``completion_ids``
        with, for each, its log-probability under the current policy (the temperature-1 raw
        log-softmax that ``generate`` records) and the engine's version; finish_reason
        ``"forced"``. Nothing is sampled."""
        ...


class EngineHost(Protocol):
    """What a unit keeps between its rollout roles: it builds the engine on entering
    rollout (``state``: weights to serve, None for the checkpoint's), loads new weights
    into it, and frees it on leaving."""

    async def start(self, state: dict[str, Any] | None, version: int, max_batch: int) -> Engine: ...

    async def publish(self, state: dict[str, Any], version: int) -> None: ...

    async def stop(self) -> None: ...
