"""The gspo loss: one importance ratio per sequence (the geometric mean of its tokens'
capped ratios), PPO's clip on it, and a trainer step with it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from gyre_core.config import ConfigError, RunConfig
from gyre_core.train.losses import LossSettings, TokenBatch, get_loss
from tests.train.test_trainer import make_trainer, params, sample_rollouts, tiny_model

GSPO = get_loss("gspo")


def settings(low: float = 0.005, high: float = 0.005, cap: float = 5.0) -> LossSettings:
    return LossSettings(0.2, 0.28, None, 0.0, cap, low, high)


def batch(shift: list[float], adv: list[float], seq: list[int]) -> TokenBatch:
    """Tokens at log-prob -1 whose behaviour log-probs were ``-1 - shift`` (log ratios)."""
    logp = torch.full((len(shift),), -1.0, dtype=torch.float64, requires_grad=True)
    behaviour = logp.detach() - torch.tensor(shift, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64)
    return TokenBatch(logp, behaviour, a, sequence=torch.tensor(seq))


def test_the_loss_against_a_hand_computation() -> None:
    # sequence 0: log ratios 0.3, -0.1 and 2.0, the last capped at log 5; sequence 1: 0, 0.2
    b = batch([0.3, -0.1, 2.0, 0.0, 0.2], [1.0, 1.0, 1.0, -0.5, -0.5], [0, 0, 0, 1, 1])
    per_token, clipped = GSPO(b, settings(low=0.9, high=10.0))  # a clip that never binds
    s0 = math.exp((0.3 - 0.1 + math.log(5.0)) / 3)
    s1 = math.exp(0.1)
    want = [-s0, -s0, -s0, 0.5 * s1, 0.5 * s1]  # -A * s_i
    torch.testing.assert_close(per_token.detach(), torch.tensor(want, dtype=torch.float64))
    per_token.sum().backward()
    assert b.logp.grad is not None and not clipped.any()
    # d/dlogp_t of -A_t * s_i * exp(logp_t - sg(logp_t)) = -A_t * s_i: s_i itself is detached
    torch.testing.assert_close(b.logp.grad, torch.tensor(want, dtype=torch.float64))
    # Uncapped, sequence 0's ratio would be exp(2.2 / 3): the cap is what lowered it.
    uncapped, _ = GSPO(b, settings(low=0.9, high=10.0, cap=100.0))
    assert float(uncapped[0].detach()) == pytest.approx(-math.exp(2.2 / 3))


def test_a_sequence_outside_the_clip_range_has_no_gradient_where_ppo_would_clip() -> None:
    # s = e^0.01 > 1.005 and e^-0.01 < 0.995 (clip 0.005 each side), per sequence of two
    shift = [0.02, 0.0, -0.02, 0.0, 0.02, 0.0, -0.02, 0.0]
    adv = [1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0]
    b = batch(shift, adv, [0, 0, 1, 1, 2, 2, 3, 3])
    per_token, clipped = GSPO(b, settings())
    per_token.sum().backward()
    assert b.logp.grad is not None
    # 0: s > 1 + high with A > 0, 1: s < 1 - low with A < 0: clipped, every token inert;
    # 2: s > 1 + high with A < 0, 3: s < 1 - low with A > 0: the pessimistic side, kept.
    assert clipped.tolist() == [True, True, True, True, False, False, False, False]
    assert b.logp.grad[:4].tolist() == [0.0] * 4
    s = torch.exp(torch.tensor([0.01, 0.01, -0.01, -0.01], dtype=torch.float64))
    torch.testing.assert_close(b.logp.grad[4:], -torch.tensor(adv[4:], dtype=torch.float64) * s)


def test_without_sequences_the_tokens_are_one_sequence() -> None:
    b = batch([0.2, 0.0], [1.0, 1.0], [0, 0])
    one = TokenBatch(b.logp, b.behaviour, b.advantage)
    torch.testing.assert_close(GSPO(one, settings(0.5, 0.5))[0], GSPO(b, settings(0.5, 0.5))[0])


def test_a_trainer_step_with_gspo(float64_exact: None) -> None:
    """``train.loss: gspo`` with its fields reaches the step: a stale batch, whose ratios are
    away from 1, trains, and a tighter clip makes more of it inert."""
    cfg = RunConfig.from_dict({"train": {"loss": "gspo", "max_tokens": 64, "lr": 1e-2,
                                         "average": "execution_then_batch"}}).train  # fmt: skip
    assert (cfg.gspo_token_cap, cfg.gspo_clip_low, cfg.gspo_clip_high) == (5.0, 0.005, 0.005)
    rollouts = sample_rollouts(tiny_model(torch.float64), groups=2)
    rng = np.random.default_rng(0)
    for r in rollouts:  # an older behaviour policy
        for c in r.calls:
            c.logprobs = c.logprobs + rng.normal(0.0, 0.3, size=len(c.logprobs))
    clipped = {}
    for clip in (0.005, 0.5):
        model = tiny_model(torch.float64)
        trainer = make_trainer(model, replace(cfg, gspo_clip_low=clip, gspo_clip_high=clip))
        before = params(model)
        out = trainer.step(rollouts)
        assert out["skipped"] == 0.0 and np.isfinite(out["loss"])
        clipped[clip] = out["clip_fraction"]
        if clip == 0.5:
            after = params(model)
            assert any(not torch.equal(before[k], after[k]) for k in before)
    assert clipped[0.005] > clipped[0.5]
    with pytest.raises(ConfigError, match="gspo_token_cap"):
        RunConfig.from_dict({"train": {"gspo_token_cap": 0.5}})
