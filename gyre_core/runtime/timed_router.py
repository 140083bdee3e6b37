"""The router every real run uses: a :class:`~gyre_core.rollout.router.Router` that records
each LLM call it completes (its engine and its start and end on the run's clock), from the
router to the completion: engine choice, the Ray round trip, waiting for a batch slot,
prefill and decode. The run's calibration (:mod:`gyre_core.runtime.calibrate`) fits the
simulator's call costs to these records at the end of the run."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gyre_core.rollout.engine import Completion, SamplingParams
from gyre_core.rollout.router import Router


@dataclass(frozen=True, slots=True)
class CallRecord:
    request_id: str  # ``<rollout_id>/<call_id>``, as the harness names it
    engine: str  # the engine that finished it
    t0: float  # seconds on the run's clock
    t1: float
    prompt_tokens: int  # the full prompt
    completion_tokens: int


class TimedRouter(Router):
    """A :class:`Router` that times every call it completes (on the run's clock)."""

    def __init__(self, *args: Any, clock: Callable[[], float] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: list[CallRecord] = []
        # record times on the run's clock (``clock``), at perf_counter precision
        self.origin = time.perf_counter() - (clock() if clock is not None else 0.0)

    async def generate(
        self, session_id: str, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        t0 = time.perf_counter() - self.origin
        out = await super().generate(session_id, prompt_ids, params, request_id=request_id)
        engine = self.session_engine(session_id) or ""
        t1 = time.perf_counter() - self.origin
        self.records.append(
            CallRecord(request_id, engine, t0, t1, len(prompt_ids), len(out.token_ids))
        )
        return out
