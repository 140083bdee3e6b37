"""The run's ``train`` section: the optimizer, the policy loss and its clip, how rewards weigh
tokens, imported rollouts, and what keeps the trainer's memory down. The supervised warm start
before RL has its own section (``warm_start``: :mod:`gyre_core.train.warm_start_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gyre_core.config_fields import config_field
from gyre_core.train.loss_registry import LOSSES
from gyre_core.trajectory.paths import DEFAULT_ROLES, ROLES, PathSampling
from gyre_core.trajectory.rewards import ADVANTAGE_MODES, AVERAGES, Weighting

# fp32: the model's own dtype throughout. bf16: float32 master weights, bfloat16 parameters
# and compute, float32 gradient reduction and optimizer state (FSDP2's mixed precision).
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True, slots=True)
class TrainConfig:
    lr: float = config_field(3e-4, "AdamW learning rate", above=0.0)
    max_grad_norm: float = config_field(1.0, "gradient clipping norm", min=0.0)
    clip_low: float = config_field(0.2, "PPO ratio clip below 1", min=0.0, max=1.0)
    clip_high: float = config_field(0.28, "PPO ratio clip above 1", min=0.0)
    kl_coef: float = config_field(0.0, "KL penalty to the initial policy", min=0.0)
    max_tokens: int = config_field(4096, "tokens per packed training sample", min=64)
    advantage_mode: str = config_field(
        "once",
        "weight of a token several rollouts share: the mean of "
        "their advantages (once) or their sum (per_path, GRPO's "
        "per-rollout gradient)",
        choices=ADVANTAGE_MODES,
    )
    normalise_std: bool = config_field(False, "divide group advantages by the group's reward std")
    average: str = config_field(
        "token",
        "how the loss averages over a batch's trained tokens: one mean over all of them "
        "(token), or a mean within each rollout, then the mean of those over the batch's "
        "rollouts (execution_then_batch: a long rollout weighs no more than a short "
        "one); set by the run's owner",
        choices=AVERAGES,
    )
    max_paths: int = config_field(
        0,
        "J_max: root-to-leaf paths of each rollout a step trains, drawn by role (train."
        "path_roles) in proportion to their untrained generated tokens; untaken subtrees are "
        "pruned before packing, shared prefixes stay as context (0 = every path); set by the "
        "run's owner",
        min=0,
        max=1_000_000,
    )
    path_roles: str = config_field(
        DEFAULT_ROLES,
        "the leaf roles path sampling takes, highest rank first, comma-separated out of "
        f"{', '.join(ROLES)} (a role left out is never trained once train.max_paths or this "
        "narrows the paths); set by the run's owner",
        max_length=80,
    )
    loss: str = config_field(
        "ppo",
        "policy loss: ppo (the importance-weighted, clipped PPO objective), decoupled (the "
        "staleness weight apart from the clip, taken against the current weights), pg "
        "(the plain policy gradient -A * logp: no ratio, no clip) or gspo (one importance "
        "ratio per rollout and sample, clipped: train.gspo_*)",
        choices=LOSSES,
    )
    ratio_cap: float = config_field(
        0.0,
        "truncate the importance weight of a token at this (ppo: a negative-advantage "
        "token's, dual-clip; decoupled: every token's staleness weight); above "
        "1 + train.clip_high (0 = off)",
        min=0.0,
    )
    gspo_token_cap: float = config_field(
        5.0,
        "loss gspo only: each token's importance ratio is capped at this before the "
        "sequence's geometric mean is taken; set by the run's owner",
        min=1.0,
    )
    gspo_clip_low: float = config_field(
        0.005,
        "loss gspo only: the sequence ratio's clip below 1; set by the run's owner",
        min=0.0,
        max=1.0,
    )
    gspo_clip_high: float = config_field(
        0.005, "loss gspo only: the sequence ratio's clip above 1; set by the run's owner", min=0.0
    )
    behaviour: str = config_field(
        "recorded",
        "behaviour log-prob of a token the current weights made: "
        "as its engine recorded it (recorded), or the trainer's own "
        "(trainer: its ratio is exactly 1, so a step does not depend on "
        "which calls shared an engine batch and colocate runs repeat "
        "exactly); older tokens always use the recorded one",
        choices=("recorded", "trainer"),
    )
    offpolicy_data: str = config_field(
        "",
        "imported rollouts trained beside each RL step's own, importance-weighted by "
        "their recorded log-probs: a gyre.trajectory/v1 file or an OpenAI message log "
        "with log-probs (docs/agents.md; '' = off)",
        path=True,
    )
    offpolicy_groups: int = config_field(
        1, "groups of train.offpolicy_data added to each RL step, cycling through the file", min=1
    )
    logit_chunk: int = config_field(
        1024,
        "trained tokens whose logits are projected at once: the "
        "vocabulary projection runs in chunks of this many, each "
        "recomputed in the backward, so no [tokens, vocab] logits are "
        "kept (0 = all at once, kept for the backward)",
        min=0,
    )
    activation_checkpointing: bool = config_field(
        False, "recompute each decoder layer in the backward instead of keeping its activations"
    )
    precision: str = config_field(
        "fp32",
        "fp32, or bf16: bfloat16 parameters and compute over float32 "
        "master weights, FSDP2's mixed precision, which only the "
        "sharded trainer has (the plain trainer refuses bf16)",
        choices=PRECISIONS,
    )

    @property
    def weighting(self) -> Weighting:
        """How the trainer turns rewards into token weights (the tree browser's too)."""
        return Weighting(self.advantage_mode, self.normalise_std, self.average)

    @property
    def path_sampling(self) -> PathSampling:
        """Which paths of a tree a step trains (the tree browser's marks too)."""
        return PathSampling.of(self.max_paths, self.path_roles)


def recorded_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's recorded :meth:`Trainer.settings` as this code writes them: one
    written before the ``warm_start`` section also records ``train.warm_start_*`` (they act
    before RL, never on a step) and ``ratio_cap`` None where ``train.ratio_cap`` is 0."""
    out = {k: v for k, v in settings.items() if not k.startswith("warm_start_")}
    if "ratio_cap" in out and out["ratio_cap"] is None:
        out["ratio_cap"] = 0.0
    return out


@dataclass(frozen=True, slots=True)
class TrainSetup:
    """What a run's trainer takes from its run config: its own ``train`` section, the
    scheduler's ``staleness_bound`` (tokens older than that many versions are not trained)
    and the run's ``seed``. The runtime cuts it from the config
    (:func:`gyre_core.runtime.plan.train_setup`); nothing in ``gyre_core.train`` reads the
    rest of a run config."""

    train: TrainConfig
    staleness_bound: int
    seed: int
