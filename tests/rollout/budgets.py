"""The rollout section the harness tests run their sessions with."""

from __future__ import annotations

from typing import Any

from gyre_core.config import RolloutConfig

# Room no test session outgrows: 4,096 context tokens, 48 tokens per call, no time limit
# (0) and a token budget none reaches, so a test's own limits are the ones that bind.
ROOMY: dict[str, Any] = {
    "context_budget": 4096, "max_new_tokens": 48, "time_budget_s": 0.0, "token_budget": 10**6,
}  # fmt: skip


def session_config(**changes: Any) -> RolloutConfig:
    """``RolloutConfig`` with ``ROOMY``'s budgets, then ``changes``."""
    return RolloutConfig(**{**ROOMY, **changes})
