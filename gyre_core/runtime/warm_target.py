"""What a warm start trains: the run's training group, or a trainer in this process.

:class:`~gyre_core.runtime.warm_start.WarmStart` drives either through
:class:`WarmTarget`: a run's :class:`~gyre_core.runtime.train_group.TrainGroup` (the
state sharded over its training units), or :class:`LocalTrainer` around a plain
:class:`~gyre_core.train.trainer.Trainer` (``gyre warm-start``, tests). Both keep their
state as a sharded checkpoint (``torch.distributed.checkpoint``: one process writes it
whole), so the warm-start cache holds one format.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from safetensors.torch import load_file

from gyre_core.train.sharded_checkpoint import load_state, save_state
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.sample import PackedSample


class WarmTarget(Protocol):
    version: int

    def prepare(self, rollouts: Iterable[Rollout], version: int) -> list[PackedSample]: ...

    async def sft(self, samples: list[PackedSample], lr: float) -> float:
        """One supervised step at rate ``lr`` (the RL rate stays); its mean loss."""
        ...

    async def load_weights(self, path: Path) -> None:
        """Full weights from a safetensors file; ``ValueError`` when they do not fit."""
        ...

    async def save_state(self, folder: Path) -> None: ...

    async def load_state(self, folder: Path) -> None: ...


class LocalTrainer:
    """A :class:`WarmTarget` over a trainer in this process."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    @property
    def version(self) -> int:
        return self.trainer.version

    @version.setter
    def version(self, value: int) -> None:
        self.trainer.version = value

    def prepare(self, rollouts: Iterable[Rollout], version: int) -> list[PackedSample]:
        return self.trainer.prepare(rollouts, version)

    async def sft(self, samples: list[PackedSample], lr: float) -> float:
        t = self.trainer
        version, rates = t.version, [g["lr"] for g in t.optimizer.param_groups]
        for g in t.optimizer.param_groups:
            g["lr"] = lr
        try:
            return float(t.sft_step(samples)["sft_loss"])
        finally:
            for g, rate in zip(t.optimizer.param_groups, rates, strict=True):
                g["lr"] = rate
            t.version = version

    async def load_weights(self, path: Path) -> None:
        try:
            self.trainer.model.load_state_dict(load_file(str(path)), strict=True)
        except RuntimeError as e:
            raise ValueError(str(e).splitlines()[0]) from None

    async def save_state(self, folder: Path) -> None:
        save_state(self.trainer, folder)

    async def load_state(self, folder: Path) -> None:
        load_state(self.trainer, folder, strict=False)
