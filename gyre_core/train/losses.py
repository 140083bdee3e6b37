"""Policy losses on tree-packed samples, with staleness correction, in a registry.

Every generated token carries the log-probability its behaviour policy gave it and that
policy's version. Per trainable token the trainer hands a loss the new log-probability
``logp`` (with gradient), the behaviour log-probability, the advantage (the token's loss
weight from ``assign_weights``) and, when a reference model is configured, its
log-probability. A loss returns a per-token objective to *minimise* and which tokens its
clipping made inert.

``ppo`` (the default) is the decoupled, importance-weighted PPO objective: the ratio
``r = exp(logp - logp_behaviour)`` corrects for the tokens having been sampled by an older
policy, and is clipped to ``[1 - clip_low, 1 + clip_high]`` so that a stale token cannot
pull the policy far. ``ratio_cap`` (optional) truncates the importance weight of a token
with a negative advantage, whose PPO objective is otherwise unbounded in ``r`` (dual-clip).
``decoupled`` separates the two roles (see its docstring). ``pg`` is the plain
importance-free policy gradient ``-A * logp``, as ``tree_pg_loss``. ``gspo`` takes one
ratio per sequence (one rollout's tokens in a sample; see :func:`gspo_loss`). A run picks
one with ``train.loss`` (the registry: :mod:`gyre_core.train.loss_registry`, torch-free).

The batch's loss is ``sum(scale * (objective + kl_coef * kl)) / sum(scale)`` over its trained
tokens, ``scale`` the token's factor of ``train.average`` (1 with ``token``: a per-token
mean; with ``execution_then_batch`` a mean per rollout, then over rollouts; see
:func:`gyre_core.trajectory.rewards.set_scale`).

Tokens whose version is older than ``current_version - staleness_bound`` are never
trained: :func:`fresh_mask` removes them before any loss sees them, and they are counted.
The KL penalty to a frozen reference uses the ``k3`` estimator
``exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0, low variance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch

from gyre_core.train.loss_registry import LOSSES as LOSSES  # re-exported
from gyre_core.train.loss_registry import LossFn as LossFn
from gyre_core.train.loss_registry import register_loss as register_loss
from gyre_core.trajectory.sample import PackedSample

if TYPE_CHECKING:
    from gyre_core.train.config import TrainConfig


@dataclass(frozen=True, slots=True)
class LossSettings:
    """What a loss reads of the trainer's settings (``train.clip_low``, ``train.clip_high``,
    ``train.ratio_cap``, 0 there being None here, ``train.kl_coef``, ``train.gspo_*``)."""

    clip_low: float
    clip_high: float
    ratio_cap: float | None
    kl_coef: float
    gspo_token_cap: float = 5.0
    gspo_clip_low: float = 0.005
    gspo_clip_high: float = 0.005

    @classmethod
    def of(cls, c: TrainConfig) -> LossSettings:
        return cls(
            c.clip_low, c.clip_high, c.ratio_cap or None, c.kl_coef,
            c.gspo_token_cap, c.gspo_clip_low, c.gspo_clip_high,
        )  # fmt: skip


@dataclass(slots=True)
class TokenBatch:
    """The trained tokens of one sample, flattened: every tensor is ``[n]``."""

    logp: torch.Tensor  # new log-probs, with gradient
    behaviour: torch.Tensor  # log-probs recorded at generation
    advantage: torch.Tensor
    ref_logp: torch.Tensor | None = None  # frozen reference model's log-probs
    # which sequence (0..k-1) each token is of: one rollout's tokens in this sample
    # (PackedSample.sequences); None: all one sequence
    sequence: torch.Tensor | None = None
    # train.average's per-token factor (PackedSample.scale); None: 1 everywhere
    scale: torch.Tensor | None = None


def ppo_loss(batch: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    adv = batch.advantage
    ratio = torch.exp(batch.logp - batch.behaviour)
    clipped_ratio = ratio.clamp(1.0 - s.clip_low, 1.0 + s.clip_high)
    # The pessimistic (smaller) of the two objectives; where the clipped one wins and is
    # constant in logp, the token has no gradient.
    objective = torch.minimum(ratio * adv, clipped_ratio * adv)
    clipped = (clipped_ratio * adv < ratio * adv).detach()
    if s.ratio_cap is not None:
        capped = (adv < 0) & (ratio > s.ratio_cap)
        objective = torch.where(capped, (s.ratio_cap * adv).to(objective.dtype), objective)
        clipped = clipped | capped.detach()
    return -objective, clipped


def decoupled_ppo_loss(batch: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO: the staleness correction is a separate, detached importance weight
    ``pi_prox / pi_behaviour`` (truncated at ``ratio_cap``), and the clipped ratio is taken
    against the proximal policy ``pi_prox`` -- the weights as they are now, so it is 1 at
    the one optimizer step a batch gets and clipping binds only on reuse."""
    adv = batch.advantage
    prox = batch.logp.detach()
    weight = torch.exp(prox - batch.behaviour)
    capped = torch.zeros_like(weight, dtype=torch.bool)
    if s.ratio_cap is not None:
        capped = weight > s.ratio_cap
        weight = weight.clamp(max=s.ratio_cap)
    ratio = torch.exp(batch.logp - prox)
    clipped_ratio = ratio.clamp(1.0 - s.clip_low, 1.0 + s.clip_high)
    objective = weight * torch.minimum(ratio * adv, clipped_ratio * adv)
    clipped = (clipped_ratio * adv < ratio * adv).detach() | capped
    return -objective, clipped


def pg_loss(batch: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return -batch.advantage * batch.logp, torch.zeros_like(batch.logp, dtype=torch.bool)


def gspo_loss(batch: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071), its GSPO-token form, with a token cap.

    A sequence ``i`` is one rollout's trained tokens in this sample (``batch.sequence``;
    a rollout split over several samples gets one ratio per sample). Its ratio is the
    geometric mean of its tokens' importance ratios, each capped at ``gspo_token_cap``:
    ``s_i = exp(mean_{t in i} min(logp_t - behaviour_t, log(gspo_token_cap)))``, detached.
    Per token ``r_t = s_i * exp(logp_t - sg(logp_t))`` (value ``s_i``, gradient
    ``s_i * grad logp_t``), and the objective is PPO's clipped one on it:
    ``min(r_t * A_t, clip(r_t, 1 - gspo_clip_low, 1 + gspo_clip_high) * A_t)``. The ratio
    depends on the sequence only, so a clip that binds makes every token of the sequence
    inert. Averaging is the caller's (``train.average``: ``execution_then_batch`` gives the
    paper's per-sequence mean, then the mean over sequences)."""
    adv = batch.advantage
    seq = batch.sequence
    if seq is None:
        seq = torch.zeros_like(adv, dtype=torch.long)
    k = int(seq.max()) + 1 if len(seq) else 0
    with torch.no_grad():
        log_ratio = (batch.logp - batch.behaviour).clamp(max=math.log(s.gspo_token_cap))
        # [k, n] membership: a matmul sums per sequence in a fixed order (no atomics)
        member = (seq[None, :] == torch.arange(k, device=seq.device)[:, None]).to(log_ratio.dtype)
        mean = (member @ log_ratio) / member.sum(1).clamp(min=1)
        seq_ratio = torch.exp(mean)[seq]
    ratio = seq_ratio * torch.exp(batch.logp - batch.logp.detach())
    clipped_ratio = ratio.clamp(1.0 - s.gspo_clip_low, 1.0 + s.gspo_clip_high)
    objective = torch.minimum(ratio * adv, clipped_ratio * adv)
    clipped = (clipped_ratio * adv < ratio * adv).detach()
    return -objective, clipped


BUILTIN: dict[str, LossFn] = {
    "ppo": ppo_loss,
    "decoupled": decoupled_ppo_loss,
    "pg": pg_loss,
    "gspo": gspo_loss,
}


def get_loss(name: str) -> LossFn:
    """The loss ``name`` (a name in :data:`LOSSES`; ``ValueError`` listing them otherwise)."""
    entry = LOSSES.lookup(name)
    return BUILTIN.get(name, entry)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token ``k3`` estimate of KL(policy || reference) from sampled tokens."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's softmax, ``[rows]`` (float32 or wider)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def fresh_mask(
    sample: PackedSample, current_version: int, staleness_bound: int
) -> tuple[np.ndarray, int]:
    """Trainable tokens recent enough to train, and how many trainable ones were too old.

    A token of version ``v`` is trained iff ``v >= current_version - staleness_bound``.
    """
    stale = sample.trainable & (sample.version < current_version - staleness_bound)
    return sample.trainable & ~stale, int(stale.sum())


def count_fresh(
    samples: Sequence[PackedSample], current_version: int, staleness_bound: int
) -> float:
    """The sum of ``scale`` over the tokens a batch will train: the normaliser that makes
    the loss a mean (``train.average``: with ``token`` the scales are 1 and this is the
    count of fresh tokens, a per-token mean; with ``execution_then_batch`` it is the number
    of rollouts trained, a mean of per-rollout means)."""
    return float(
        sum(
            float(s.scale[fresh_mask(s, current_version, staleness_bound)[0]].sum())
            for s in samples
        )
    )


@dataclass(slots=True)
class LossStats:
    """Detached sums over trained tokens; ``summary`` turns them into per-token means.

    Sums (not means) so that shards and samples add up in any order or grouping."""

    objective: float = 0.0  # sum of the per-token objective times scale (before normalising)
    kl: float = 0.0  # sum of the per-token KL times scale
    scale: float = 0.0  # sum of the scales: the loss's normaliser (tokens, with average token)
    entropy: float = 0.0
    clipped: float = 0.0
    ratio: float = 0.0
    tokens: float = 0.0
    stale_dropped: float = 0.0
    staleness: float = 0.0
    samples: float = 0.0

    def add(self, other: LossStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self, kl_coef: float) -> dict[str, float]:
        n, w = self.tokens, self.scale

        def mean(x: float) -> float:
            return x / n if n else float("nan")

        def average(x: float) -> float:  # as the loss averages (train.average)
            return x / w if w else float("nan")

        return {
            "loss": average(self.objective + kl_coef * self.kl),
            "kl": average(self.kl),
            "entropy": mean(self.entropy),
            "clip_fraction": mean(self.clipped),
            "ratio_mean": mean(self.ratio),
            "tokens": n,
            "stale_dropped": self.stale_dropped,
            "staleness_mean": mean(self.staleness),
            "samples": self.samples,
        }


def combine_loss(
    fn: LossFn,
    batch: TokenBatch,
    settings: LossSettings,
    normalise: float,
) -> tuple[torch.Tensor, LossStats]:
    """The sample's share of the batch loss,
    ``sum(scale * (objective + kl_coef * kl)) / normalise`` (``scale``: ``batch.scale``, 1
    when None), and its detached stats (entropy and staleness are filled in by the caller)."""
    if not normalise > 0:
        raise ValueError(f"normalise must be positive, got {normalise}")
    if not bool(torch.isfinite(batch.behaviour).all()):
        raise ValueError("a trained token has no behaviour log-prob (nan or inf)")
    per_token, clipped = fn(batch, settings)
    if batch.scale is not None:
        per_token = per_token * batch.scale
    total = per_token.sum()
    kl = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    if batch.ref_logp is not None:
        kl_t = k3_kl(batch.logp, batch.ref_logp)
        kl = (kl_t if batch.scale is None else kl_t * batch.scale).sum()
        if settings.kl_coef:
            total = total + settings.kl_coef * kl
    with torch.no_grad():
        ratio = torch.exp(batch.logp - batch.behaviour)
        stats = LossStats(
            objective=float(per_token.sum()),
            kl=float(kl),
            clipped=float(clipped.sum()),
            ratio=float(ratio.sum()),
            tokens=float(len(batch.logp)),
            scale=float(len(batch.logp)) if batch.scale is None else float(batch.scale.sum()),
            samples=1.0,
        )
    return total / normalise, stats
