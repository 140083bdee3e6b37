"""Training checkpoints that resume exactly: weights, optimizer, RNGs, data position.

A checkpoint is a directory ``<root>/step-<version, 8 digits>/`` holding

* ``model.safetensors``: the weights (also what an engine can ``publish``);
* ``optimizer.pt``: the optimizer state (loaded with ``weights_only=True``);
* ``rng.safetensors``: torch's CPU (and CUDA) generator states;
* ``state.json``: policy version, the trainer's settings, the caller's data position (an opaque
  JSON object such as ``{"next_task": 96}``), and the Python and numpy RNG states.

It is written to a hidden temporary directory beside it and renamed into place, so a crash
never leaves a half-written ``step-*`` directory for :func:`latest_checkpoint` to pick.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from gyre_core.train.checkpoint_dirs import STATE_FILE, checkpoints
from gyre_core.train.config import recorded_settings
from gyre_core.train.trainer import WEIGHTS_FILE, Trainer

FORMAT = "gyre.checkpoint/v1"
SHARDED_FORMAT = "gyre.checkpoint/v2"  # a run's: the training group's sharded state
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.safetensors"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    version: int
    data_position: dict[str, Any]
    config: dict[str, Any]  # the trainer's settings() when it was written


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The Python and numpy states (JSON-able) and the torch states (tensors)."""
    py = random.getstate()
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy form is always a tuple
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    plain = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
    }
    return plain, tensors


def set_rng_state(plain: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    v, state, gauss = plain["python"]
    random.setstate((v, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(
    root: str | Path, trainer: Trainer, data_position: dict[str, Any] | None = None
) -> Path:
    """Write ``trainer``'s full state under ``root`` as ``step-<version>``; return its path.

    An existing checkpoint of the same version is replaced (after the new one is written).
    """
    position = dict(data_position or {})
    try:
        json.dumps(position)
    except TypeError as e:
        raise ValueError(f"data_position must be JSON-serialisable: {e}") from None
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{trainer.version:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    trainer.export_weights(tmp)
    torch.save(trainer.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    plain, tensors = rng_state()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / RNG_FILE))
    state = {
        "format": FORMAT,
        "version": trainer.version,
        "config": trainer.settings(),
        "data_position": position,
        "rng": plain,
    }
    (tmp / STATE_FILE).write_text(json.dumps(state))
    if final.exists():  # same version saved again: swap the old one out, then drop it
        old = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    return final


def load_checkpoint(
    path: str | Path, trainer: Trainer, *, restore_rng: bool = True, strict_config: bool = True
) -> Checkpoint:
    """Restore weights, optimizer, version (and RNG states) into ``trainer``.

    With ``strict_config`` a checkpoint written under a different trainer config is refused,
    naming the fields that differ, since resuming it would not continue the same run.
    """
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint (no {STATE_FILE})")
    state = json.loads(state_file.read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{state_file}: format {state.get('format')!r}, expected {FORMAT!r}")
    config = recorded_settings(state["config"])
    mine = trainer.settings()
    if strict_config and config != mine:
        diff = sorted(k for k in mine.keys() | config.keys() if mine.get(k) != config.get(k))
        raise ValueError(
            f"{path}: written under a different trainer config ({', '.join(diff)} differ); "
            "pass strict_config=False to load it anyway"
        )
    weights = load_file(str(path / WEIGHTS_FILE))
    model_state = trainer.model.state_dict()
    dev = {k: v.device for k, v in model_state.items()}
    trainer.model.load_state_dict({k: v.to(dev.get(k, v.device)) for k, v in weights.items()})
    optim = torch.load(path / OPTIMIZER_FILE, map_location=trainer.device, weights_only=True)
    trainer.optimizer.load_state_dict(optim)
    trainer.version = int(state["version"])
    if restore_rng:
        set_rng_state(state["rng"], load_file(str(path / RNG_FILE)))
    return Checkpoint(path, trainer.version, dict(state["data_position"]), config)


def prune_checkpoints(root: str | Path, keep_last: int, keep_every: int = 0) -> list[Path]:
    """Delete the complete checkpoints under ``root`` that the retention rule drops; return
    their paths, oldest first. Kept: the newest ``keep_last`` and every one whose version is
    a multiple of ``keep_every`` (0: none). ``keep_last`` 0 keeps all, and the newest is
    always kept. Only ``step-<version>`` directories holding ``state.json`` count: other
    names, hidden temporary directories and a checkpoint still being written are left alone.
    Each is first renamed to a hidden name, so a crash mid-delete leaves no half checkpoint.
    """
    if keep_last < 0 or keep_every < 0:
        raise ValueError(f"keep_last and keep_every must be >= 0, got {keep_last}, {keep_every}")
    found = checkpoints(root)
    if keep_last == 0:
        return []
    newest = {v for v, _ in found[-keep_last:]}
    drop = [
        (v, p) for v, p in found if v not in newest and not (keep_every and v % keep_every == 0)
    ]
    for _, path in drop:
        doomed = path.with_name(f".del-{path.name}-{os.getpid()}")
        os.replace(path, doomed)
        shutil.rmtree(doomed)
    return [p for _, p in drop]
