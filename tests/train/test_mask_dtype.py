"""The dense tree mask under FSDP2's bf16 policy: the additive bias that reaches SDPA has the
query's dtype and that dtype's own most negative value (never -inf from a float32
``finfo.min`` cast down); a float bias of another dtype is refused by name. A real
1-process gloo group; a spy on ``scaled_dot_product_attention`` records what each call got
(the attention still runs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gyre_core.train.config import TrainConfig
from gyre_core.train.sharded import ShardedTrainer, unit_mesh
from gyre_core.train.tree_attention import additive_mask, check_mask_dtype, tree_mask
from tests.train.test_trainer import make_trainer, sample_rollouts, tiny_model
from tests.train.world import alone

BF16 = torch.bfloat16


@pytest.fixture
def group() -> Iterator[None]:
    alone("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_bf16_sharded_step_hands_sdpa_a_bias_in_the_querys_dtype(
    group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = sample_rollouts(tiny_model(seed=1), groups=1, group_size=2, length=4, seed=7)
    sharded = ShardedTrainer(
        make_trainer(tiny_model(), TrainConfig(precision="bf16")), unit_mesh(1, 1)
    )
    seen: list[tuple[torch.dtype, torch.dtype, float]] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):  # type: ignore[no-untyped-def]
        assert attn_mask is not None, "the tree path always passes a mask"
        seen.append((q.dtype, attn_mask.dtype, float(attn_mask.float().min())))
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    metrics = sharded.step(batch)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["version"] == 1
    assert seen, "no attention ran"
    lowest = torch.finfo(BF16).min
    assert all(s == (BF16, BF16, lowest) for s in seen), seen[:2]
    parent = torch.tensor([-1, 0, 1, 1])
    mask = tree_mask(sharded.trainer.model, parent)  # the master weights are float32
    assert next(sharded.trainer.model.parameters()).dtype == torch.float32
    assert mask.dtype == BF16 and float(mask.min()) == lowest  # type: ignore[union-attr]


def test_a_float_mask_of_another_dtype_is_refused_by_name() -> None:
    mask = additive_mask(torch.tensor([[True, False], [True, True]]), torch.float32)
    with pytest.raises(ValueError, match=r"tree mask is torch\.float32 but the model computes in"):
        check_mask_dtype(mask, BF16)
    check_mask_dtype(mask, torch.float32)
    check_mask_dtype(mask > -1, BF16)  # a boolean mask has no dtype to disagree with
