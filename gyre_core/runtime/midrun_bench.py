"""Held-out benchmark points during RL (``rollout.benchmark_every``).

Every k-th version the run scores the held-out benchmark on a copy of that version's
weights, served by a torch engine of its own in the driver, while rollouts and training go
on. The score is the weights of exactly that version (a copy taken right after the step),
emitted as a ``benchmark`` event at that step, so the dashboard's benchmark curve rises
during the run instead of showing only its two ends."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine

Score = Callable[[Router, int], Awaitable[float]]


class BenchmarkEvery:
    """Schedules a scoring of version ``v`` whenever ``v`` is a multiple of ``every``
    (0: never) and below ``last`` (the run's own final benchmark scores that one)."""

    def __init__(self, every: int, last: int, score: Score, say: Callable[[str], None]) -> None:
        self.every, self.last, self.score, self.say = every, last, score, say
        self.tasks: list[asyncio.Task[float]] = []
        self.scores: dict[int, float] = {}

    def after_step(self, model: Any, version: int) -> None:
        if not self.every or version % self.every or version >= self.last:
            return
        engine = TorchEngine(copy.deepcopy(model), version=version)
        self.tasks.append(asyncio.ensure_future(self._one(engine, version)))

    async def _one(self, engine: TorchEngine, version: int) -> float:
        try:
            score = await self.score(Router({"benchmark": engine}), version)
        finally:
            engine.close()
        self.scores[version] = score
        self.say(f"benchmark at version {version}: {score:.3f}")
        return score

    async def finish(self) -> dict[int, float]:
        """Waits for the scorings still running; the versions' scores."""
        await asyncio.gather(*self.tasks)
        return dict(sorted(self.scores.items()))
