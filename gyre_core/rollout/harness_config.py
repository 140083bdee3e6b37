"""``HarnessConfig``: the knobs of one agent session, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HarnessConfig:
    """Budgets and behaviour of :func:`~gyre_core.rollout.harness.run_session`.

    A session that runs out of ``max_turns`` (environment steps, all agents together),
    ``token_budget`` (generated tokens, all calls together) or ``time_budget_s`` (seconds on
    the harness clock) stops with status ``timeout`` and keeps the progress it reached.
    """

    max_turns: int = 64
    # Compact when an agent's context passes this many tokens: the agent writes a summary
    # and its context restarts from task prompt + summary. Should exceed prompt + summary.
    context_budget: int = 4096
    max_new_tokens: int = 48  # per model call (the scripted oracle is not bound by it)
    temperature: float = 1.0
    time_budget_s: float | None = None  # None: no limit
    token_budget: int | None = None  # None: no limit
    delegate: bool = False  # hand each component to a sub-agent with its own context
    max_retries: int = 2  # restores to a save point, per session
    # Real seconds slept per simulated second of tool latency (0: do not sleep; the
    # harness clock advances by the simulated latency either way).
    tool_time_scale: float = 0.0
    retry_after_errors: int = 3  # this many error observations in a row count as a failure
    progress_every: int = 1  # emit rollout_progress every k turns
    subagent_max_turns: int | None = None  # None: max_turns // components (at least 1)

    def __post_init__(self) -> None:
        _positive_int("max_turns", self.max_turns)
        _positive_int("context_budget", self.context_budget)
        _positive_int("max_new_tokens", self.max_new_tokens)
        _positive_int("retry_after_errors", self.retry_after_errors)
        _positive_int("progress_every", self.progress_every)
        if self.subagent_max_turns is not None:
            _positive_int("subagent_max_turns", self.subagent_max_turns)
        if self.token_budget is not None:
            _positive_int("token_budget", self.token_budget)
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ValueError(f"max_retries must be an integer, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        _finite("temperature", self.temperature, minimum=0.0)
        _finite("tool_time_scale", self.tool_time_scale, minimum=0.0)
        if self.time_budget_s is not None:
            _finite("time_budget_s", self.time_budget_s, minimum=0.0)
            if self.time_budget_s == 0:
                raise ValueError("time_budget_s must be > 0 (or None for no limit), got 0")
        if not isinstance(self.delegate, bool):
            raise ValueError(f"delegate must be True or False, got {self.delegate!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _finite(name: str, value: object, *, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value}")


__all__ = ["HarnessConfig"]
