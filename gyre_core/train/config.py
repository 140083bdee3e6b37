"""The run's ``train`` section: the optimizer, the PPO clip, how rewards weigh tokens, the
supervised warm start before RL, and what keeps the trainer's memory down."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field
from gyre_core.trajectory.rewards import ADVANTAGE_MODES, Weighting

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
    behaviour: str = config_field(
        "recorded",
        "behaviour log-prob of a token the current weights made: "
        "as its engine recorded it (recorded), or the trainer's own "
        "(trainer: its ratio is exactly 1, so a step does not depend on "
        "which calls shared an engine batch and colocate runs repeat "
        "exactly); older tokens always use the recorded one",
        choices=("recorded", "trainer"),
    )
    warm_start_steps: int = config_field(
        0, "supervised steps on scripted demonstrations first", min=0
    )
    warm_start_demos: int = config_field(
        0, "fresh scripted demonstrations per warm-start step (0 = rollout.tasks_per_step)", min=0
    )
    warm_start_lr: float = config_field(
        0.0, "learning rate of the warm start (0 = train.lr)", min=0.0
    )
    warm_start_skip_check: float = config_field(
        0.0,
        "share of checks the warm-start demonstrator skips "
        "(a hasty demonstrator, docs/learning.md)",
        min=0.0,
        max=0.95,
    )
    warm_start_until_loss: float = config_field(
        0.0,
        "end the warm start early once the mean loss of its "
        "last 20 steps is at or under this (0 = run every "
        "step)",
        min=0.0,
    )
    warm_start_anneal_steps: int = config_field(
        0,
        "steps after the warm start ends (its cap or its "
        "target loss) at warm_start_anneal_lr, which settles "
        "the copying a high rate keeps noisy",
        min=0,
    )
    warm_start_anneal_lr: float = config_field(
        0.0, "learning rate of those steps (0 = train.lr)", min=0.0
    )
    warm_start_settle_loss: float = config_field(
        0.0,
        "after the annealing tail, while the mean loss of its last 20 "
        "steps is above this, another round: warm_start_anneal_steps at "
        "warm_start_lr, then the tail again (0 = no rounds)",
        min=0.0,
    )
    warm_start_rounds: int = config_field(
        3, "the most rounds warm_start_settle_loss adds", min=0, max=100
    )
    warm_start_fresh_optimizer: bool = config_field(
        True,
        "RL starts with fresh AdamW moments after the "
        "warm start (its moments, scaled to the warm "
        "start's larger gradients, shrink RL's steps)",
    )
    warm_start_from: str = config_field(
        "",
        "weights file of an earlier warm start (a .safetensors written "
        "by `gyre warm-start CONFIG --out FILE`) that RL begins from "
        "instead of running one ('' = off)",
        path=True,
    )
    warm_start_data: str = config_field(
        "",
        "demonstrations the warm start trains on instead of the scripted "
        "demonstrator: a gyre.trajectory/v1 file or an OpenAI message log "
        "(docs/agents.md; '' = scripted)",
        path=True,
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
    warm_start_cache: str = config_field(
        "",
        "folder keeping warm-started trainers keyed by everything "
        "they depend on, reused by later runs ('' = off)",
        path=True,
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
        return Weighting(self.advantage_mode, self.normalise_std)


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
