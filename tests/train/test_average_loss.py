"""train.average in the trainer: on a batch of two executions, one long and one short, the
packed loss and its gradient are the hand-computed averages of per-execution linear
losses: a mean over all tokens (token) or a mean within each execution, then over the
executions (execution_then_batch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gyre_core.config import TrainConfig
from gyre_core.trajectory.format import Call, Rollout
from tests.train.test_trainer import make_trainer, tiny_model

PROMPT = [1, 2, 3, 4]
LONG = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # reward 1: advantage +0.5
SHORT = [20, 21, 22]  # reward 0: advantage -0.5


def execution(rid: str, completion: list[int], reward: float) -> Rollout:
    n = len(completion)
    c = Call("c0", np.asarray(PROMPT, dtype=np.int64), np.asarray(completion, dtype=np.int64),
             np.full(n, -1.0), np.zeros(n, dtype=np.int64))  # fmt: skip
    return Rollout(rid, "task", "completed", reward, [c], "g")


def linear_loss(model: torch.nn.Module, completion: list[int], adv: float) -> torch.Tensor:
    """One execution on its own, as a plain sequence: ``-A * log pi`` per completion token."""
    ids = torch.tensor([PROMPT + completion])
    logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].double(), -1)
    targets = ids[0, len(PROMPT) :]
    return -adv * logp[len(PROMPT) - 1 : -1].gather(1, targets[:, None])[:, 0]


@pytest.mark.parametrize("average", ["token", "execution_then_batch"])
def test_the_loss_is_the_chosen_average_of_per_execution_losses(
    average: str, float64_exact: None
) -> None:
    model = tiny_model(torch.float64)
    trainer = make_trainer(model, TrainConfig(max_tokens=64, loss="pg", average=average))
    rollouts = [execution("long", LONG, 1.0), execution("short", SHORT, 0.0)]
    samples = trainer.prepare(rollouts, current_version=0)
    grads, stats = trainer.compute_grads(samples)

    long, short = linear_loss(model, LONG, 0.5), linear_loss(model, SHORT, -0.5)
    if average == "token":
        want = (long.sum() + short.sum()) / (len(LONG) + len(SHORT))
    else:  # the long execution weighs no more than the short one
        want = (long.mean() + short.mean()) / 2
    params = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    hand = torch.autograd.grad(want, params, allow_unused=True, materialize_grads=True)
    for name, w in zip(names, hand, strict=True):
        torch.testing.assert_close(grads[name], w, rtol=1e-9, atol=1e-12)
    assert sum(float(w.abs().sum()) for w in hand) > 1e-3
    summary = stats.summary(0.0)
    assert summary["loss"] == pytest.approx(float(want.detach()), rel=1e-9)
    assert summary["tokens"] == len(LONG) + len(SHORT)
    # The two averages differ on this batch: the mode is what made the gradient.
    token = float(((long.sum() + short.sum()) / (len(LONG) + len(SHORT))).detach())
    per_execution = float(((long.mean() + short.mean()) / 2).detach())
    assert token != pytest.approx(per_execution, rel=1e-3)


def test_a_step_with_the_execution_average_trains_and_reports_finite_figures() -> None:
    model = tiny_model(torch.float64)
    cfg = TrainConfig(lr=1e-2, max_tokens=64, average="execution_then_batch")
    trainer = make_trainer(model, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    out = trainer.step([execution("long", LONG, 1.0), execution("short", SHORT, 0.0)])
    assert out["skipped"] == 0.0 and np.isfinite(out["loss"]) and out["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
