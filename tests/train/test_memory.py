"""The trainer's memory savers (``train/memory.py``): log-probs projected in chunks equal the
full-logits path (values, loss, entropy, gradients; dense and sparse attention; tied
embeddings; FSDP2), activation checkpointing changes no gradient, and ``train.precision``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gyre_core.config import ConfigError, RunConfig, TrainConfig
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train import sparse_attention
from gyre_core.train.losses import TokenBatch, combine_loss, count_fresh, fresh_mask, token_entropy
from gyre_core.train.memory import chunked_logprobs, tree_logprobs
from gyre_core.train.sharded import ShardedTrainer, unit_mesh
from gyre_core.train.trainer import Trainer, demo_sample
from gyre_core.train.tree_attention import token_logprobs, tree_forward
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.synth import synth_rollouts
from tests.train.test_trainer import (
    CONFIG,
    SYNTH,
    make_trainer,
    sample_rollouts,
    tiny_model,
)
from tests.train.world import join_world, world_port

TIED = tiny_qwen3_config(ModelShape(
    32, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128,
    max_positions=256, tie_embeddings=True,
))  # fmt: skip
RTOL = 1e-5


def _model(impl: str, tied: bool = False) -> Any:
    backend = "gyre_tree" if impl == "sparse" else "sdpa"
    return build_model(TIED if tied else CONFIG, attn_implementation=backend)


def _samples(trainer: Trainer) -> list[PackedSample]:
    return trainer.prepare(synth_rollouts(replace(SYNTH, groups=1)), trainer.version)


def _tensors(s: PackedSample) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(s.input_ids), torch.from_numpy(s.position_ids),
            torch.from_numpy(s.parent))  # fmt: skip


def _grads(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    got = torch.autograd.grad(
        loss, [p for _, p in named], allow_unused=True, materialize_grads=True
    )
    return {n: g for (n, _), g in zip(named, got, strict=True)}


@contextmanager
def _kept() -> Iterator[list[int]]:
    """The sizes of the tensors autograd keeps for the backward (those a checkpointed
    region keeps, its inputs, are not seen)."""
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield sizes


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    rel = float((got - want).detach().norm() / want.detach().norm().clamp_min(1e-12))
    assert rel < RTOL, f"{what}: {rel:.2e} relative"


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse_attention, "BLOCK", 16)  # several blocks per sample


@pytest.mark.parametrize(("impl", "tied"), [("dense", False), ("sparse", False), ("dense", True)])
def test_chunked_logprobs_equal_the_full_logits(impl: str, tied: bool) -> None:
    model = _model(impl, tied)
    trainer = make_trainer(model, TrainConfig(max_tokens=100), version=2, attention=impl)
    s = max(_samples(trainer), key=len)
    ids, pos, parent = _tensors(s)
    rows = torch.from_numpy(np.flatnonzero(s.trainable))
    assert len(rows) % 3 and len(rows) > 3  # 3 does not divide the rows
    w = torch.randn(len(rows), generator=torch.Generator().manual_seed(0))
    logits = tree_forward(model, ids, pos, parent, impl)  # type: ignore[arg-type]
    want_lp = token_logprobs(logits, ids, parent)[rows]
    want_ent = token_entropy(logits.detach()[parent[rows]])
    want = _grads(model, (w * want_lp).sum())
    for chunk in (0, 1, 3, 1024):
        lp, ent = tree_logprobs(model, ids, pos, parent, rows, impl, chunk=chunk)  # type: ignore[arg-type]
        _close(lp, want_lp, f"log-probs, chunk {chunk}")
        _close(ent, want_ent, f"entropy, chunk {chunk}")
        assert not ent.requires_grad
        got = _grads(model, (w * lp).sum())
        for name, g in want.items():
            _close(got[name], g, f"gradient of {name}, chunk {chunk}")


def test_chunks_keep_no_logits_for_the_backward() -> None:
    """What autograd keeps from the forward: the logits of every row without chunks, only
    the hidden states (and the weights) with them."""
    head = torch.nn.Linear(8, 1000, bias=False)
    hidden = torch.randn(50, 8, requires_grad=True)
    targets = torch.randint(0, 1000, (50,))
    grads, biggest = [], []
    for chunk in (0, 8):
        with _kept() as kept:
            lp, _ = chunked_logprobs(head, hidden, targets, chunk)
        grads.append(torch.autograd.grad(lp.sum(), hidden)[0])
        biggest.append(max(kept, default=0))
    _close(grads[1], grads[0], "gradient of the hidden states")
    assert biggest[0] >= 50 * 1000 and biggest[1] <= head.weight.numel()


def _full_logits_loss(
    t: Trainer, s: PackedSample, normalise: float
) -> tuple[torch.Tensor, float, float]:
    """The trainer's loss of ``s`` as it was computed before chunks: full ``[L, V]``
    logits, then the trained tokens' rows (``behaviour="recorded"``, no reference)."""
    keep, _ = fresh_mask(s, t.version, t.staleness_bound)
    idx = torch.from_numpy(np.flatnonzero(keep))
    ids, pos, parent = _tensors(s)
    logits = tree_forward(t.model, ids, pos, parent, t.options.attention)
    lp = token_logprobs(logits, ids, parent)[idx]

    def column(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(lp.dtype)[idx]

    batch = TokenBatch(lp, column(s.logprob), column(s.advantage))
    loss, stats = combine_loss(t.loss_fn, batch, t.loss_settings, normalise)
    entropy = float(token_entropy(logits.detach()[parent[idx]]).sum())
    return loss, stats.objective, entropy


@pytest.mark.parametrize("impl", ["dense", "sparse"])
def test_the_trainers_loss_entropy_and_gradients_equal_the_full_logits(impl: str) -> None:
    for chunk in (0, 5, 1024):
        cfg = TrainConfig(max_tokens=100, logit_chunk=chunk)
        t = make_trainer(_model(impl), cfg, version=2, attention=impl)
        samples = _samples(t)
        n = float(count_fresh(samples, 2, t.staleness_bound))
        got, stats = t.compute_grads(samples)
        parts = [_full_logits_loss(t, s, n) for s in samples]
        want = _grads(t.model, sum((p[0] for p in parts), torch.zeros(())))
        assert stats.objective == pytest.approx(sum(p[1] for p in parts), rel=RTOL)
        assert stats.entropy == pytest.approx(sum(p[2] for p in parts), rel=RTOL)
        for name, g in want.items():
            _close(got[name], g, f"{impl}, chunk {chunk}: gradient of {name}")


def test_sft_step_takes_the_full_logits_gradient() -> None:
    batch = [([1, 2, 3], [4, 5, 6, 7, 8, 9, 10]), ([5], [6, 7, 8, 9])]
    t = make_trainer(tiny_model(), TrainConfig(logit_chunk=3))
    samples = [demo_sample(*b) for b in batch]
    n = sum(int(s.trainable.sum()) for s in samples)
    loss = torch.zeros(())
    for s in samples:
        ids, pos, parent = _tensors(s)
        lp = token_logprobs(tree_forward(t.model, ids, pos, parent), ids, parent)
        loss = loss - lp[torch.from_numpy(s.trainable)].sum() / n
    want = _grads(t.model, loss)
    seen: dict[str, torch.Tensor] = {}  # each parameter's gradient once the batch is in
    for name, p in t.params:
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: seen.update({name: p.grad.clone()})
        )
    metrics = t.sft_step(batch)
    assert metrics["sft_loss"] == pytest.approx(float(loss.detach()), rel=RTOL)
    for name, g in want.items():
        _close(seen[name], g, f"gradient of {name}")


@pytest.mark.parametrize("impl", ["dense", "sparse"])
def test_activation_checkpointing_changes_no_gradient_and_keeps_less(impl: str) -> None:
    grads, kept = [], []
    for ac in (False, True):
        cfg = TrainConfig(max_tokens=100, activation_checkpointing=ac)
        t = make_trainer(_model(impl), cfg, version=2, attention=impl)
        samples = _samples(t)
        with _kept() as sizes:
            g, _ = t.compute_grads(samples)
        grads.append(g)
        kept.append(sum(sizes))
    for name, want in grads[0].items():
        _close(grads[1][name], want, f"{impl}: gradient of {name}")
    assert kept[1] < 0.5 * kept[0], f"activations kept: {kept[1]} with, {kept[0]} without"


def test_precision_is_checked_by_name() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"train": {"precision": "fp16", "logit_chunk": -1}})
    assert [path for path, _ in err.value.errors] == ["train.logit_chunk", "train.precision"]
    assert "must be one of fp32, bf16, got 'fp16'" in dict(err.value.errors)["train.precision"]
    t = make_trainer(tiny_model(), TrainConfig(precision="bf16"))
    with pytest.raises(ValueError, match=r'train.precision="bf16" needs the sharded trainer'):
        t.step(sample_rollouts(tiny_model(seed=1)))
    with pytest.raises(ValueError, match=r"needs the sharded trainer"):
        t.sft_step([([1, 2], [3, 4])])
    assert t.version == 0


def _process(rank: int, port: int, out: str) -> None:
    """One of two FSDP2 processes of a training unit (gloo): a step with chunks of 3 and
    activation checkpointing in fp32, then one in bf16 (FSDP2's mixed precision)."""
    torch.set_num_threads(1)
    join_world(rank, 2, port)
    try:
        batch = sample_rollouts(tiny_model(seed=1), groups=3, group_size=4, length=6, seed=7)
        cfg = TrainConfig(logit_chunk=3, activation_checkpointing=True)
        fp32 = ShardedTrainer(make_trainer(tiny_model(), cfg), unit_mesh(1, 2))
        result: dict[str, Any] = {"metrics": fp32.step(batch), "params": fp32.full_state_dict()}
        bf16_cfg = TrainConfig(logit_chunk=3, precision="bf16")
        bf16 = ShardedTrainer(make_trainer(tiny_model(), bf16_cfg), unit_mesh(1, 2), "bf16")
        result["bf16"] = bf16.step(batch)
        if rank == 0:
            torch.save(result, out)
        dist.barrier()  # no process tears its connections down while a peer still works
    finally:
        dist.destroy_process_group()


def test_fsdp2_with_chunks_and_checkpointing_takes_the_plain_step(tmp_path: Path) -> None:
    out = tmp_path / "sharded.pt"
    with world_port() as port:
        mp.spawn(_process, args=(port, str(out)), nprocs=2, join=True)
    got = torch.load(out)
    plain = make_trainer(tiny_model(), TrainConfig(logit_chunk=0))
    batch = sample_rollouts(tiny_model(seed=1), groups=3, group_size=4, length=6, seed=7)
    want = plain.step(batch)
    for name, p in plain.model.named_parameters():
        _close(got["params"][name], p.detach(), f"sharded {name}")
    assert got["metrics"]["loss"] == pytest.approx(want["loss"], rel=RTOL, abs=1e-7)
    assert got["metrics"]["entropy"] == pytest.approx(want["entropy"], rel=RTOL)
    assert got["metrics"]["grad_norm"] == pytest.approx(want["grad_norm"], rel=RTOL)
    # bf16 compute: the same step up to bfloat16's rounding
    assert got["bf16"]["tokens"] == want["tokens"]
    assert got["bf16"]["entropy"] == pytest.approx(want["entropy"], rel=0.05)
