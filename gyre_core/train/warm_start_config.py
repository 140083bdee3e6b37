"""The run's ``warm_start`` section: supervised steps on demonstrations before RL (scripted
ones, a file of them, or the weights of an earlier warm start), the annealing tail and its
rounds, and the cache of warm-started trainers (:mod:`gyre_core.runtime.warm_start`).

Its fields were ``train.warm_start_*``; a config that still names one is refused with the
new name (:data:`MOVED`). ``train.warm_start_from`` is ``warm_start.weights`` (``from`` is
a Python keyword)."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field


@dataclass(frozen=True, slots=True)
class WarmStartConfig:
    steps: int = config_field(0, "supervised steps on scripted demonstrations first", min=0)
    demos: int = config_field(
        0, "fresh scripted demonstrations per warm-start step (0 = rollout.tasks_per_step)", min=0
    )
    lr: float = config_field(0.0, "learning rate of the warm start (0 = train.lr)", min=0.0)
    skip_check: float = config_field(
        0.0,
        "share of checks the warm-start demonstrator skips "
        "(a hasty demonstrator, docs/learning.md)",
        min=0.0,
        max=0.95,
    )
    until_loss: float = config_field(
        0.0,
        "end the warm start early once the mean loss of its "
        "last 20 steps is at or under this (0 = run every "
        "step)",
        min=0.0,
    )
    anneal_steps: int = config_field(
        0,
        "steps after the warm start ends (its cap or its "
        "target loss) at warm_start.anneal_lr, which settles "
        "the copying a high rate keeps noisy",
        min=0,
    )
    anneal_lr: float = config_field(0.0, "learning rate of those steps (0 = train.lr)", min=0.0)
    settle_loss: float = config_field(
        0.0,
        "after the annealing tail, while the mean loss of its last 20 "
        "steps is above this, another round: warm_start.anneal_steps at "
        "warm_start.lr, then the tail again (0 = no rounds)",
        min=0.0,
    )
    rounds: int = config_field(3, "the most rounds warm_start.settle_loss adds", min=0, max=100)
    fresh_optimizer: bool = config_field(
        True,
        "RL starts with fresh AdamW moments after the "
        "warm start (its moments, scaled to the warm "
        "start's larger gradients, shrink RL's steps)",
    )
    weights: str = config_field(
        "",
        "weights file of an earlier warm start (a .safetensors written "
        "by `gyre warm-start CONFIG --out FILE`) that RL begins from "
        "instead of running one ('' = off)",
        path=True,
    )
    data: str = config_field(
        "",
        "demonstrations the warm start trains on instead of the scripted "
        "demonstrator: a gyre.trajectory/v1 file or an OpenAI message log "
        "(docs/agents.md; '' = scripted)",
        path=True,
    )
    cache: str = config_field(
        "",
        "folder keeping warm-started trainers keyed by everything "
        "they depend on, reused by later runs ('' = off)",
        path=True,
    )


# train.warm_start_<old> -> warm_start.<new>: a config naming an old key is refused with this.
_SAME = ("steps", "demos", "lr", "skip_check", "until_loss", "anneal_steps", "anneal_lr")
_SAME2 = ("settle_loss", "rounds", "fresh_optimizer", "data", "cache")
MOVED: dict[str, str] = {
    f"train.warm_start_{old}": f"warm_start.{new}"
    for old, new in (*((n, n) for n in _SAME + _SAME2), ("from", "weights"))
}
