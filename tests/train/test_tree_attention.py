"""Tree attention on a real (tiny, random) Qwen3: packed trees must match linear sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train import sparse_attention
from gyre_core.train.tree_attention import (
    Impl,
    dense_tree_mask,
    dense_tree_masks,
    flex_tree_block_mask,
    flex_unavailable_reason,
    token_logprobs,
    tree_forward,
    tree_pg_loss,
    tree_subtree_end,
)
from gyre_core.trajectory.sample import PackedSample, depths
from tests.train.conftest import exact_rmsnorm

VOCAB = 97
CONFIG = tiny_qwen3_config(
    ModelShape(VOCAB, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128)
)

# Three trees and a lone root in one preorder sample. Tree A branches at tokens 1, 2 and 8
# into branches of lengths 4, 1, 2 and 1; tree B at 14; tree C is a plain chain.
PARENT = np.array(
    # A: 0..12                                  B: 13..20                      C: 21..23, lone 24
    [*[-1, 0, 1, 2, 3, 4, 5, 2, 7, 8, 9, 8, 1], *[-1, 13, 14, 15, 14, 17, 18, 19], -1, 21, 22, -1],
    dtype=np.int64,
)
L = len(PARENT)
IDS = np.random.default_rng(0).integers(0, VOCAB, size=L).astype(np.int64)
LEAVES = [i for i in range(L) if i not in set(PARENT.tolist())]


def path_to(i: int) -> list[int]:
    """Indices from the root down to token ``i``, by walking up ``PARENT``."""
    path = [i]
    while PARENT[path[-1]] >= 0:
        path.append(int(PARENT[path[-1]]))
    return path[::-1]


def branch_training(seed: int = 1) -> tuple[list[float], list[set[int]]]:
    """Per leaf branch: an advantage and the tokens it trains (a varied subset of non-roots).

    Shared tokens are trained by some of the branches through them but not all, as when a
    token is generated in one rollout and only prompt context in another.
    """
    rng = np.random.default_rng(seed)
    advantages = rng.normal(size=len(LEAVES)).round(3).tolist()
    trains = [{i for i in path_to(leaf)[1:] if rng.random() < 0.7 or i == leaf} for leaf in LEAVES]
    return advantages, trains


def make_sample() -> PackedSample:
    advantages, trains = branch_training()
    weight = np.zeros(L)
    for a, t in zip(advantages, trains, strict=True):
        weight[list(t)] += a  # the packed weight: summed over the branches that train it
    trainable = np.zeros(L, dtype=bool)
    trainable[list(set().union(*trains))] = True
    return PackedSample(
        group_ids=["g"],
        group=np.zeros(L, dtype=np.int32),
        input_ids=IDS.copy(),
        position_ids=depths(PARENT),
        parent=PARENT.copy(),
        trainable=trainable,
        advantage=np.where(trainable, weight, 0.0),
        logprob=np.where(trainable, -1.5, np.nan),
        version=np.where(trainable, 0, -1).astype(np.int64),
    )


def ancestor_mask(parent: list[int]) -> torch.Tensor:
    """Brute force: walk up from every token, marking each ancestor-or-self."""
    n = len(parent)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        k = q
        while k >= 0:
            mask[q, k] = True
            k = parent[k]
    return mask


def tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.from_numpy(IDS), torch.from_numpy(depths(PARENT)), torch.from_numpy(PARENT)


# ---------------------------------------------------------------- masks


def test_dense_mask_matches_ancestor_walk() -> None:
    assert torch.equal(dense_tree_mask(PARENT), ancestor_mask(PARENT.tolist()))


@st.composite
def preorder_forests(draw: st.DrawFn) -> list[int]:
    """Random preorder forests: each token hangs off some token on the current path, or
    starts a new tree."""
    choices = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=40))
    parent: list[int] = []
    stack: list[int] = []  # the path from the root to the previous token
    for i, c in enumerate(choices):
        d = c % (len(stack) + 1)  # 0: a new root; else a child of stack[d - 1]
        parent.append(stack[d - 1] if d else -1)
        stack = [*stack[:d], i]
    return parent


@settings(max_examples=60, deadline=None)
@given(preorder_forests())
def test_dense_mask_property(parent: list[int]) -> None:
    assert torch.equal(dense_tree_mask(torch.tensor(parent)), ancestor_mask(parent))


@pytest.mark.parametrize(
    "parent",
    [[-1, 0, -1, 1], [-1, 0, 1, 0, 2], [0], [-1, 1], [-1, -2]],
    ids=["root-splits-subtree", "child-after-sibling", "self-parent", "future-parent", "bad"],
)
def test_non_preorder_layouts_are_rejected(parent: list[int]) -> None:
    with pytest.raises(ValueError):
        tree_subtree_end(np.array(parent))


def test_batched_masks_pad_with_self_attention() -> None:
    a, b = np.array([-1, 0, 0]), np.array([-1, 0, 1, -1, 3])
    masks = dense_tree_masks([a, b], length=6)
    assert masks.shape == (2, 6, 6)
    assert torch.equal(masks[0, :3, :3], ancestor_mask(a.tolist()))
    assert torch.equal(masks[1, :5, :5], ancestor_mask(b.tolist()))
    assert not masks[0, :3, 3:].any()  # real tokens never see padding
    assert torch.equal(masks[0, 3:, 3:], torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("block", [1, 4, 8, 16, 128])
def test_flex_block_mask_matches_create_block_mask(block: int) -> None:
    end = tree_subtree_end(PARENT)

    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return (kv <= q) & (q < end[kv])

    ours = flex_tree_block_mask(PARENT, block_size=block)
    ref = create_block_mask(mask_mod, None, None, L, L, device="cpu", BLOCK_SIZE=block)
    assert ours.shape == ref.shape == (1, 1, L, L)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    # And its mask_mod, evaluated on whole blocks (past L too), is the tree mask.
    n = ours.kv_indices.shape[-1] * block
    grid = torch.arange(n)
    zero = torch.tensor(0)
    full = ours.mask_mod(zero, zero, grid[:, None], grid[None, :])
    assert torch.equal(full[:L, :L], ancestor_mask(PARENT.tolist()))
    assert not full[:, L:].any()


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize(
    ("dtype", "attn", "impl", "tol"),
    [  # eager's softmax runs in float32 whatever the model dtype, hence its looser bound
        (torch.float64, "sdpa", "dense", 1e-12),
        (torch.float64, "eager", "dense", 1e-6),
        (torch.float32, "sdpa", "dense", 1e-5),
        (torch.float64, "gyre_tree", "sparse", 1e-12),
        (torch.float32, "gyre_tree", "sparse", 1e-5),
    ],
)
@pytest.mark.parametrize("block", [128, 4])
def test_packed_logits_equal_linear_paths(
    dtype: torch.dtype,
    attn: str,
    impl: Impl,
    tol: float,
    block: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sparse_attention, "BLOCK", block)  # 4: many query blocks
    model = build_model(CONFIG, dtype=dtype, attn_implementation=attn)
    ids, pos, parent = tensors()
    with torch.no_grad():
        packed = tree_forward(model, ids, pos, parent, impl)
        assert packed.shape == (L, VOCAB)
        for i in range(L):
            path = path_to(i)
            alone = model(input_ids=ids[path][None], use_cache=False).logits[0, -1]
            torch.testing.assert_close(packed[i], alone, rtol=tol, atol=tol, msg=f"token {i}")


def test_without_the_tree_mask_logits_differ() -> None:
    # Negative control: this sample is sensitive to the mask. Without one, transformers
    # sees depth position_ids and guesses *packed sequences* (a new one wherever the
    # position does not step by 1) - not a tree, so branches see their siblings.
    model = build_model(CONFIG, dtype=torch.float64)
    ids, pos, parent = tensors()
    with torch.no_grad():
        tree = tree_forward(model, ids, pos, parent)
        guessed = model(input_ids=ids[None], position_ids=pos[None], use_cache=False).logits[0]
    wrong = (tree - guessed).abs().amax(dim=-1) > 1e-6
    assert wrong[7:12].all()  # tokens after a branch point see their earlier siblings


def test_token_logprobs() -> None:
    logits = torch.randn(L, VOCAB, dtype=torch.float64)
    ids, _, parent = tensors()
    lp = token_logprobs(logits, ids, parent)
    for i in range(L):
        p = int(PARENT[i])
        want = 0.0 if p < 0 else torch.log_softmax(logits[p], -1)[IDS[i]].item()
        assert lp[i].item() == pytest.approx(want, abs=1e-12)
    half = token_logprobs(logits.to(torch.bfloat16), ids, parent)
    assert half.dtype == torch.float32


# ---------------------------------------------------------------- loss and gradients


def test_pg_loss_value_and_options() -> None:
    model = build_model(CONFIG, dtype=torch.float64)
    sample = make_sample()
    loss, info = tree_pg_loss(model, sample)
    with torch.no_grad():
        ids, pos, parent = tensors()
        lp = token_logprobs(tree_forward(model, ids, pos, parent), ids, parent).numpy()
    assert loss.item() == pytest.approx(-(sample.advantage * lp)[sample.trainable].sum(), rel=1e-12)
    assert info["trainable_tokens"] == sample.trainable.sum()
    assert info["tokens"] == L
    assert info["logprob_delta_mean"] == pytest.approx(lp[sample.trainable].mean() + 1.5)
    halved, _ = tree_pg_loss(model, sample, normalise=2.0)
    assert halved.item() == pytest.approx(loss.item() / 2, rel=1e-12)
    sample.trainable[0] = True  # a root: nothing predicts it
    with pytest.raises(ValueError, match="root"):
        tree_pg_loss(model, sample)


@pytest.mark.parametrize(("exact", "tol"), [(True, 1e-10), (False, 1e-5)], ids=["exact", "stock"])
@pytest.mark.parametrize(("attn", "impl"), [("sdpa", "dense"), ("gyre_tree", "sparse")])
def test_gradient_equals_sum_over_linear_branches(
    exact: bool, tol: float, attn: str, impl: Impl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "stock" is the model as transformers ships it: float64 except for RMSNorm, which
    # computes in float32, so gradients summed in a different order agree to ~1e-7 only.
    if exact:
        monkeypatch.setattr(Qwen3RMSNorm, "forward", exact_rmsnorm)
    monkeypatch.setattr(sparse_attention, "BLOCK", 4)
    model = build_model(CONFIG, dtype=torch.float64, attn_implementation=attn)
    sample = make_sample()
    params = [p for p in model.parameters() if p.requires_grad]

    loss, _ = tree_pg_loss(model, sample, impl)
    packed = torch.autograd.grad(loss, params)

    advantages, trains = branch_training()
    ref_loss = torch.zeros((), dtype=torch.float64)
    for leaf, adv, trained in zip(LEAVES, advantages, trains, strict=True):
        path = path_to(leaf)
        ids = torch.from_numpy(IDS[path])
        logits = model(input_ids=ids[None], use_cache=False).logits[0]
        lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]
        weight = torch.tensor([adv if i in trained else 0.0 for i in path[1:]], dtype=torch.float64)
        ref_loss = ref_loss - (weight * lp).sum()
    reference = torch.autograd.grad(ref_loss, params)

    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-10)
    for g, r in zip(packed, reference, strict=True):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)
    assert sum(float(r.abs().sum()) for r in reference) > 1e-3  # not vacuous


# ---------------------------------------------------------------- flex attention

FLEX_REASON = flex_unavailable_reason("cpu", torch.float32)


@pytest.mark.slow
@pytest.mark.skipif(FLEX_REASON is not None, reason=f"flex attention: {FLEX_REASON}")
def test_flex_logits_equal_dense() -> None:
    # Compiles flex attention with inductor's C++ template: ~30 s on a cold cache, a few
    # seconds warm. float32 and no_grad, the only combination torch 2.13 runs on CPU.
    dense_model = build_model(CONFIG, attn_implementation="sdpa")
    flex_model = build_model(CONFIG, attn_implementation="flex_attention")
    ids, pos, parent = tensors()
    with torch.no_grad():
        dense = tree_forward(dense_model, ids, pos, parent, impl="dense")
        flex = tree_forward(flex_model, ids, pos, parent, impl="flex")
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def test_flex_needs_the_flex_backend_and_says_why_it_cannot_run() -> None:
    ids, pos, parent = tensors()
    with pytest.raises(ValueError, match="flex_attention"):
        tree_forward(build_model(CONFIG), ids, pos, parent, impl="flex")
    flex_model = build_model(CONFIG, dtype=torch.float64, attn_implementation="flex_attention")
    with pytest.raises(RuntimeError, match="unavailable"):  # CPU: no backward, no float64
        tree_forward(flex_model, ids, pos, parent, impl="flex")
