"""An external agent that dies before its first call, as one with a missing package or a
bad key does (tests/runtime/test_failed_rollouts.py names it by import path)."""

from __future__ import annotations

from typing import Any


def agent(task: Any) -> None:
    raise ModuleNotFoundError("No module named 'smolagents'")
