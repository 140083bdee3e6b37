"""Held-out benchmark points during RL (``rollout.benchmark_every``).

Every k-th version the run scores the held-out benchmark on that version's weights,
served by an engine of its own (``serve``: in a real run a Ray actor of its own, so the
driver holds no model), while rollouts and training go on. The score is the weights of exactly that version (a copy taken right after the step),
emitted as a ``benchmark`` event at that step, so the dashboard's benchmark curve rises
during the run instead of showing only its two ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from gyre_core.rollout.engine import Engine
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine

Score = Callable[[Router, int], Awaitable[float]]
# An engine serving ``weights`` (a state dict, or a Ray reference to one) as ``version``.
Serve = Callable[[Any, int], AbstractAsyncContextManager[Engine]]


def serve_local(make_model: Callable[[], Any]) -> Serve:
    """A :data:`Serve` that builds a model in this process (``make_model``), loads the
    weights (a state dict) and serves it with a torch engine: tests and local tools."""

    @asynccontextmanager
    async def serve(weights: Any, version: int) -> AsyncIterator[Engine]:
        model = make_model()
        model.load_state_dict(weights)
        engine = TorchEngine(model, version=version)
        try:
            yield engine
        finally:
            engine.close()

    return serve


class BenchmarkEvery:
    """Schedules a scoring of version ``v`` whenever ``v`` is a multiple of ``every``
    (0: never) and below ``last`` (the run's own final benchmark scores that one)."""

    def __init__(
        self, every: int, last: int, score: Score, say: Callable[[str], None], serve: Serve
    ) -> None:
        self.every, self.last, self.score, self.say, self.serve = every, last, score, say, serve
        self.tasks: list[asyncio.Task[float]] = []
        self.scores: dict[int, float] = {}

    def after_step(self, weights: Any, version: int) -> None:
        """``weights``: version ``version``'s, which the scoring keeps (a state dict of its
        own, or a Ray reference)."""
        if not self.every or version % self.every or version >= self.last:
            return
        self.tasks.append(asyncio.ensure_future(self._one(weights, version)))

    async def _one(self, weights: Any, version: int) -> float:
        async with self.serve(weights, version) as engine:
            score = await self.score(Router({"benchmark": engine}), version)
        self.scores[version] = score
        self.say(f"benchmark at version {version}: {score:.3f}")
        return score

    async def finish(self) -> dict[int, float]:
        """Waits for the scorings still running; the versions' scores."""
        await asyncio.gather(*self.tasks)
        return dict(sorted(self.scores.items()))
