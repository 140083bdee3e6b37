"""Sharded checkpoints of a trainer (``torch.distributed.checkpoint``): each process of a
group writes its own shards, any width reads them back; ``trainer.json`` beside them holds
the version and the trainer's settings."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from gyre_core.train.config import recorded_settings
from gyre_core.train.trainer import Trainer

TRAINER_FILE = "trainer.json"  # a sharded checkpoint's version and trainer settings


def save_state(
    trainer: Trainer, directory: Path, version: int | None = None, *, alone: bool = False
) -> None:
    """Write ``trainer``'s weights and AdamW state as a sharded checkpoint
    (``torch.distributed.checkpoint``: each process of a group its own shards; a trainer
    outside any group writes them whole) and, from the first process, ``trainer.json``
    (version, settings). It loads at any width (:func:`load_state`). A fresh optimizer (no
    moments yet) is saved as such, so that it loads fresh. ``alone``: this process writes
    its whole state in a group whose other processes take no part (a streaming core)."""
    fresh = not trainer.optimizer.state  # get_state_dict would take a zero step to fill it
    if fresh:
        state: dict[str, Any] = {"model": get_model_state_dict(trainer.model)}
    else:
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    dcp_save(state, checkpoint_id=str(directory), no_dist=alone)
    if alone or not dist.is_initialized() or dist.get_rank() == 0:
        meta = {
            "version": trainer.version if version is None else version,
            "fresh_optimizer": fresh,
            "settings": trainer.settings(),
        }
        (Path(directory) / TRAINER_FILE).write_text(json.dumps(meta, indent=1) + "\n")


def load_state(
    trainer: Trainer, directory: Path, *, strict: bool = True, alone: bool = False
) -> int:
    """Continue from a checkpoint :func:`save_state` wrote, at any width (each process reads
    the parts of the shards it holds now); returns its version. A checkpoint of other
    trainer settings is refused by name (``strict=False``: only the weights and moments
    are taken). The learning rate stays the trainer's. ``alone``: as :func:`save_state`'s."""
    meta = json.loads((Path(directory) / TRAINER_FILE).read_text())
    if strict:
        mine = json.loads(json.dumps(trainer.settings()))
        theirs = recorded_settings(meta["settings"])
        diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        if diff:
            other = ", ".join(diff)
            raise ValueError(f"{directory}: a checkpoint of other trainer settings ({other})")
    if meta.get("fresh_optimizer"):
        model_sd = get_model_state_dict(trainer.model)
        dcp_load({"model": model_sd}, checkpoint_id=str(directory), no_dist=alone)
        set_model_state_dict(trainer.model, model_sd)
        trainer.optimizer.state.clear()
    else:
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
        dcp_load(
            {"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory), no_dist=alone
        )
        set_state_dict(
            trainer.model, trainer.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
        )
        for g in trainer.optimizer.param_groups:
            g["lr"] = trainer.config.lr
    trainer.version = int(meta["version"])
    return trainer.version


def read_checkpoint(directory: Path) -> dict[str, Any]:
    """A sharded checkpoint's whole content (``model``, and ``optim`` unless the optimizer
    was fresh) gathered in this process: for tools and tests, never a training path."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "whole.pt"
        dcp_to_torch_save(str(directory), str(out))
        whole: dict[str, Any] = torch.load(out, weights_only=False)
    return whole
