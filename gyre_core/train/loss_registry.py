"""The loss registry, torch-free: ``train.loss`` takes its choices from it and
``gyre_core.config`` imports no torch. The built-in losses (``ppo``, ``decoupled``, ``pg``,
``gspo``) are defined in :mod:`gyre_core.train.losses`; each entry here imports that module
at its first call (:func:`gyre_core.train.losses.get_loss` hands the trainer the function
itself).
``register_loss`` adds another loss, which the config then accepts by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gyre_core.registry import Registry

if TYPE_CHECKING:
    import torch

    from gyre_core.train.losses import LossSettings, TokenBatch

# A loss: (tokens, settings) -> (per-token objective to minimise [n], clipped [n] bool).
LossFn = Callable[["TokenBatch", "LossSettings"], tuple["torch.Tensor", "torch.Tensor"]]
LOSSES: Registry[LossFn] = Registry("loss")
register_loss = LOSSES.register
BUILTIN_LOSSES = ("ppo", "decoupled", "pg", "gspo")  # the default first


def _builtin(name: str) -> LossFn:
    def call(batch: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
        from gyre_core.train.losses import BUILTIN

        return BUILTIN[name](batch, s)

    return call


for _name in BUILTIN_LOSSES:
    register_loss(_name)(_builtin(_name))
