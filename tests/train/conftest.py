"""Shared helpers for the training tests."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm


def exact_rmsnorm(self: Qwen3RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """Qwen3RMSNorm as written, less its cast to float32 (which, in a float64 model, is a
    downcast: it and its backward round to float32 precision)."""
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


@pytest.fixture
def float64_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a float64 model in float64 throughout, for tight gradient comparisons."""
    monkeypatch.setattr(Qwen3RMSNorm, "forward", exact_rmsnorm)
