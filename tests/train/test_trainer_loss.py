"""The staleness-corrected PPO loss: agreement with the plain policy gradient, clipping,
the importance-weight cap, stale-token dropping and the KL estimator."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from gyre_core.config import TrainConfig
from gyre_core.train.losses import LossSettings, TokenBatch, get_loss, k3_kl, ppo_loss
from gyre_core.train.tree_attention import token_logprobs, tree_forward, tree_pg_loss
from gyre_core.trajectory.sample import PackedSample
from tests.train.test_trainer import make_trainer, sample_rollouts, tiny_model


def current_logprobs(model: torch.nn.Module, s: PackedSample) -> np.ndarray:
    ids, parent = torch.from_numpy(s.input_ids), torch.from_numpy(s.parent)
    with torch.no_grad():
        logits = tree_forward(model, ids, torch.from_numpy(s.position_ids), parent)  # type: ignore[arg-type]
        return token_logprobs(logits, ids, parent).double().numpy()


def grads_of(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True))


@pytest.mark.parametrize("loss", ["ppo", "pg", "gspo"])
def test_on_policy_loss_is_the_plain_policy_gradient(loss: str, float64_exact: None) -> None:
    model = tiny_model(torch.float64)
    trainer = make_trainer(model, TrainConfig(max_tokens=64, loss=loss))
    samples = trainer.prepare(sample_rollouts(model, groups=3), current_version=0)
    for s in samples:  # behaviour = current policy exactly: every ratio is 1
        s.logprob = np.where(s.trainable, current_logprobs(model, s), np.nan)
    grads, stats = trainer.compute_grads(samples)
    n = sum(int(s.trainable.sum()) for s in samples)
    assert stats.tokens == n and stats.clipped == 0 and stats.ratio == pytest.approx(n)
    plain = sum(tree_pg_loss(model, s, normalise=n)[0] for s in samples)
    assert isinstance(plain, torch.Tensor)
    want = grads_of(model, plain)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    for name, w in zip(names, want, strict=True):
        torch.testing.assert_close(grads[name], w, rtol=1e-9, atol=1e-12)
    assert sum(float(w.abs().sum()) for w in want) > 1e-3  # a real gradient, not zeros


def test_clipping_zeroes_the_gradient_of_clipped_tokens() -> None:
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    shift = torch.tensor([0.0, 1.0, 0.0, -1.0, 1.0, -1.0], dtype=torch.float64)  # log ratios
    # ratio: 1 (free), e (A>0: clipped above), 1 (free), 1/e (A<0: clipped below),
    # e (A<0: PPO does not bound it), 1/e (A>0: pessimistic side, unclipped)
    expect_clipped = [False, True, False, True, False, False]
    for cap, capped in ((None, False), (2.0, True)):
        logp = torch.full((6,), -1.5, dtype=torch.float64, requires_grad=True)
        batch = TokenBatch(logp, logp.detach() - shift, adv)
        per_token, clipped = ppo_loss(batch, LossSettings(0.2, 0.28, cap, 0.0))
        per_token.sum().backward()
        assert logp.grad is not None
        want = list(expect_clipped)
        want[4] = capped  # the importance-weight cap truncates the unbounded negative case
        assert clipped.tolist() == want
        zero = logp.grad == 0
        assert zero.tolist() == want
        # An unclipped token's gradient is -A * ratio (d ratio / d logp = ratio).
        free = ~torch.tensor(want)
        torch.testing.assert_close(logp.grad[free], (-adv * torch.exp(shift))[free])


def test_decoupled_loss_weights_stale_tokens_by_the_truncated_importance_ratio() -> None:
    adv = torch.tensor([1.0, -1.0, 1.0, 0.5], dtype=torch.float64)
    shift = torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=torch.float64)
    logp = torch.full((4,), -1.0, dtype=torch.float64, requires_grad=True)
    batch = TokenBatch(logp, logp.detach() - shift, adv)
    per_token, clipped = get_loss("decoupled")(batch, LossSettings(0.2, 0.28, 3.0, 0.0))
    per_token.sum().backward()
    assert logp.grad is not None
    weight = torch.exp(shift).clamp(max=3.0)  # e^2 > 3: truncated
    torch.testing.assert_close(logp.grad, -adv * weight)
    assert clipped.tolist() == [False, False, True, False]


def test_clip_fraction_counts_far_off_policy_tokens() -> None:
    model = tiny_model(torch.float64)
    trainer = make_trainer(model, TrainConfig(max_tokens=64))
    samples = trainer.prepare(sample_rollouts(model, groups=2), current_version=0)
    for s in samples:  # behaviour 2 nats below current: every ratio is e^2 > 1 + clip_high
        s.logprob = np.where(s.trainable, current_logprobs(model, s) - 2.0, np.nan)
    _, stats = trainer.compute_grads(samples)
    positive = sum(int((s.trainable & (s.advantage > 0)).sum()) for s in samples)
    assert positive > 0
    assert stats.clipped == positive  # exactly the tokens with A > 0 are clipped
    assert stats.ratio / stats.tokens == pytest.approx(np.exp(2.0), rel=1e-9)
    # Clipped tokens carry no gradient: zeroing their advantage changes nothing.
    zeroed = [replace(s, advantage=np.where(s.advantage > 0, 0.0, s.advantage)) for s in samples]
    grads, _ = trainer.compute_grads(samples)
    again, _ = trainer.compute_grads(zeroed, normalise=stats.tokens)
    for name in grads:
        torch.testing.assert_close(grads[name], again[name], rtol=1e-9, atol=1e-14)
    assert any(float(g.abs().sum()) > 0 for g in grads.values())


def test_stale_tokens_are_dropped_and_counted() -> None:
    model = tiny_model(torch.float64)
    trainer = make_trainer(model, TrainConfig(max_tokens=256), staleness_bound=2)
    old = sample_rollouts(model, groups=2, version=1, seed=1, tag="old")
    new = sample_rollouts(model, groups=2, version=4, seed=2, tag="new")
    mixed = trainer.prepare(old + new, current_version=5)
    assert len(mixed) == 1  # both generations share one packed sample
    grads, stats = trainer.compute_grads(mixed, current_version=5)
    # Unique generated positions: a token that several rollouts share is trained once.
    old_tokens = sum(int(s.trainable.sum()) for s in trainer.prepare(old, 5))
    new_tokens = sum(int(s.trainable.sum()) for s in trainer.prepare(new, 5))
    assert stats.stale_dropped == old_tokens and stats.tokens == new_tokens
    assert stats.staleness / stats.tokens == 1.0  # 5 - 4
    only_new, _ = trainer.compute_grads(trainer.prepare(new, 5), current_version=5)
    for name in grads:
        torch.testing.assert_close(grads[name], only_new[name], rtol=1e-9, atol=1e-14)
    # At the bound itself a token still trains (version 3 = 5 - 2).
    _, edge = trainer.compute_grads(trainer.prepare(old, 3), current_version=3)
    assert edge.stale_dropped == 0 and edge.tokens == old_tokens


def test_tokens_newer_than_the_policy_are_refused() -> None:
    model = tiny_model(torch.float32)
    trainer = make_trainer(model)
    with pytest.raises(ValueError, match="newer than the current version 2"):
        trainer.prepare(sample_rollouts(model, groups=1, version=3), current_version=2)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere() -> None:
    a = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.equal(k3_kl(a, a), torch.zeros(3))
    assert bool((k3_kl(a, a + torch.tensor([0.3, -0.7, 1.0])) > 0).all())


def test_unknown_loss_names_the_registered_ones() -> None:
    with pytest.raises(
        ValueError, match="unknown loss 'dpo'; expected one of ppo, decoupled, pg, gspo"
    ):
        get_loss("dpo")


def test_each_loss_a_run_config_names_trains_a_step(float64_exact: None) -> None:
    """``train.loss`` reaches the trainer: on the same stale batch each registered loss is
    the function its step uses, and each gives a different step (the default,
    ppo with no ratio cap, is the loss every run trained before ``train.loss``)."""
    from gyre_core.config import RunConfig
    from gyre_core.train.losses import BUILTIN, LOSSES
    from gyre_core.train.trainer import Trainer

    default = RunConfig().train
    assert (default.loss, default.ratio_cap) == ("ppo", 0.0)
    rollouts = sample_rollouts(tiny_model(torch.float64), groups=3)
    rng = np.random.default_rng(0)
    objective, clipped, grads = {}, {}, {}
    for name in LOSSES:
        cfg = RunConfig.from_dict({"train": {"loss": name, "max_tokens": 64}})
        model = tiny_model(torch.float64)
        trainer = Trainer(model, cfg.train, staleness_bound=cfg.scheduler.staleness_bound,
                          seed=cfg.seed)  # fmt: skip
        assert trainer.loss_fn is BUILTIN[name] and trainer.loss_settings.ratio_cap is None
        samples = trainer.prepare(rollouts, current_version=0)
        for s in samples:  # an older behaviour policy: ratios away from 1, some clipped
            noise = rng.normal(0.0, 0.5, size=len(s.trainable))
            s.logprob = np.where(s.trainable, current_logprobs(model, s) + noise, np.nan)
        g, stats = trainer.compute_grads(samples)
        objective[name], clipped[name] = stats.objective, stats.clipped
        grads[name] = torch.cat([v.flatten() for v in g.values()])
    assert list(objective) == ["ppo", "decoupled", "pg", "gspo"]
    assert clipped["ppo"] > 0 and clipped["pg"] == 0  # pg has no clip
    for a, b in itertools.combinations(objective, 2):
        assert objective[a] != objective[b] and not torch.allclose(grads[a], grads[b]), (a, b)
