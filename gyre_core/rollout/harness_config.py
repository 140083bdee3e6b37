"""``HarnessOptions``: the harness's own knobs, beyond the budgets of the run's ``rollout``
section (``RolloutConfig``: turns, context, tokens per call, temperature, time and token
budgets, tool time scale), which every session takes as its config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HarnessOptions:
    """Behaviour of :func:`~gyre_core.rollout.harness.run_session` that no run config sets
    (research scripts and tests do); validated once at construction."""

    delegate: bool = False  # hand each component to a sub-agent with its own context
    max_retries: int = 2  # restores to a save point, per session
    retry_after_errors: int = 3  # this many error observations in a row count as a failure
    progress_every: int = 1  # emit rollout_progress every k turns
    subagent_max_turns: int | None = None  # None: max_turns // components (at least 1)

    def __post_init__(self) -> None:
        _positive_int("retry_after_errors", self.retry_after_errors)
        _positive_int("progress_every", self.progress_every)
        if self.subagent_max_turns is not None:
            _positive_int("subagent_max_turns", self.subagent_max_turns)
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ValueError(f"max_retries must be an integer, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not isinstance(self.delegate, bool):
            raise ValueError(f"delegate must be True or False, got {self.delegate!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


__all__ = ["HarnessOptions"]
