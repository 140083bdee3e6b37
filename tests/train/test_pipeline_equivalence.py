"""End to end: log -> trees -> weights -> bounded samples -> packed loss, against training
every rollout branch (or every unique token) as its own linear sequence."""

from __future__ import annotations

import pytest
import torch

from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train import sparse_attention
from gyre_core.train.tree_attention import tree_pg_loss
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.rewards import assign_weights
from gyre_core.trajectory.synth import PRESETS, synth_rollouts
from gyre_core.trajectory.tree import build_trees
from tests.trajectory.naive import Naive

CONFIG = tiny_qwen3_config(ModelShape(
    PRESETS["tiny"].vocab_size, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
    intermediate=128, max_positions=512,
))  # fmt: skip
MAX_TOKENS = 150  # below the tiny log's tree sizes: trees are split, context repeated


def packed_loss(model: torch.nn.Module, mode: str) -> torch.Tensor:
    rollouts = list(synth_rollouts(PRESETS["tiny"]))
    trees = build_trees(rollouts).values()
    for t in trees:
        assign_weights(t, mode=mode)  # type: ignore[arg-type]
    samples = pack_trees(trees, MAX_TOKENS)
    assert len(samples) > len(trees) and max(len(s) for s in samples) <= MAX_TOKENS
    return sum(
        (tree_pg_loss(model, s, "sparse")[0] for s in samples), torch.zeros((), dtype=torch.float64)
    )


def linear_logprobs(model: torch.nn.Module, seq: tuple[int, ...]) -> torch.Tensor:
    """log pi(seq[d] | seq[:d]) for d >= 1, from one plain causal forward pass."""
    ids = torch.tensor(seq)
    logits = model(input_ids=ids[None], use_cache=False).logits[0]
    return torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]


@pytest.fixture
def model(float64_exact: None, monkeypatch: pytest.MonkeyPatch) -> torch.nn.Module:
    monkeypatch.setattr(sparse_attention, "BLOCK", 16)
    return build_model(CONFIG, dtype=torch.float64, attn_implementation="gyre_tree")


def test_per_path_gradient_equals_per_branch_linear_training(model: torch.nn.Module) -> None:
    params = list(model.parameters())
    packed = torch.autograd.grad(packed_loss(model, "per_path"), params)

    ref = Naive(list(synth_rollouts(PRESETS["tiny"])))
    loss = torch.zeros((), dtype=torch.float64)
    branches = 0
    for i, r in enumerate(ref.rollouts):
        for branch in ref.branches(i):
            branches += 1
            lp = linear_logprobs(model, branch)
            gen = torch.tensor([i in ref.pos[(r.group_id, branch[: d + 1])].gen_rollouts
                                for d in range(1, len(branch))])  # fmt: skip
            loss = loss - ref.adv[i] * lp[gen].sum()
    assert branches > len(ref.rollouts)  # the tiny log really branches
    linear = torch.autograd.grad(loss, params)
    for g, want in zip(packed, linear, strict=True):
        torch.testing.assert_close(g, want, rtol=1e-9, atol=1e-11)
    assert sum(float(w.abs().sum()) for w in linear) > 1e-3


def test_once_trains_each_generated_token_exactly_once(model: torch.nn.Module) -> None:
    params = list(model.parameters())
    packed = torch.autograd.grad(packed_loss(model, "once"), params)

    ref = Naive(list(synth_rollouts(PRESETS["tiny"])))
    loss = torch.zeros((), dtype=torch.float64)
    for (group, key), pos in ref.pos.items():
        if pos.generated:  # each unique generated position once, from its own context
            lp = linear_logprobs(model, key)[-1]
            loss = loss - ref.weight((group, key), "once") * lp
    linear = torch.autograd.grad(loss, params)
    for g, want in zip(packed, linear, strict=True):
        torch.testing.assert_close(g, want, rtol=1e-9, atol=1e-11)
