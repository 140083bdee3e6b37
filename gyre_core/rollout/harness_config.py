"""``HarnessOptions``: what the built-in harness does in a session beyond the budgets of the
run's ``rollout`` section (turns, context, tokens per call, temperature, time and token
budgets, tool time scale), which every session takes as its config.

A run's sessions take them from that section (:meth:`HarnessOptions.of`: ``rollout.delegate``,
``rollout.subagent_max_turns``, ``rollout.max_retries``). The error streak that counts as a
failure and how often progress is reported are constants no run config sets
(:data:`RETRY_AFTER_ERRORS`, :data:`PROGRESS_EVERY`); research scripts and tests may still
pass other values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gyre_core.rollout.config import RolloutConfig

RETRY_AFTER_ERRORS = 3  # this many error observations in a row count as a failure
PROGRESS_EVERY = 1  # emit rollout_progress every k turns


@dataclass(frozen=True, slots=True)
class HarnessOptions:
    """Behaviour of :func:`~gyre_core.rollout.harness.run_session`, validated once at
    construction; a run's come from its ``rollout`` section (:meth:`of`)."""

    delegate: bool = False  # hand each component to a sub-agent with its own context
    max_retries: int = 2  # restores to a save point, per session
    retry_after_errors: int = RETRY_AFTER_ERRORS
    progress_every: int = PROGRESS_EVERY
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

    @classmethod
    def of(cls, rollout: RolloutConfig) -> HarnessOptions:
        """The options of a run's sessions: its ``rollout`` section's (defaults: the same
        as ``HarnessOptions()``)."""
        cap = rollout.subagent_max_turns or None
        return cls(rollout.delegate, rollout.max_retries, subagent_max_turns=cap)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


__all__ = ["PROGRESS_EVERY", "RETRY_AFTER_ERRORS", "HarnessOptions"]
