"""Checks shared by the scoring tests of both engine backends."""

from __future__ import annotations

import pytest
import torch

from gyre_core.trajectory import Rollout, build_trees, tree_stats
from gyre_core.trajectory.format import full_sequences


def hf_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    """A plain transformers forward: logprob of each completion token after its prefix."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def check_scored_rollout(r: Rollout, model: torch.nn.Module, version: int, atol: float) -> None:
    """Every call of a scripted rollout through an engine carries the policy's logprobs
    (equal to a transformers forward over its full sequence) and the engine's version."""
    seqs = full_sequences(r)
    for c in r.calls:
        n = len(c.completion_ids)
        assert n == len(c.logprobs) == len(c.versions) > 0
        assert set(c.versions.tolist()) == {version}
        assert (c.logprobs < 0).all()  # real logprobs, not the no-engine 0.0
        full = seqs[c.call_id].tolist()
        expected = hf_logprobs(model, full[: c.prompt_len], full[c.prompt_len :])
        assert c.logprobs.tolist() == pytest.approx(expected, abs=atol)
    stats = tree_stats(build_trees([r]).values())  # the tree builder accepts the log
    assert stats["calls"] == len(r.calls)
