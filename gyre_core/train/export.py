"""A run's checkpoint as a plain Hugging Face model directory (``gyre export``).

The weights come from a run checkpoint (the training group's sharded state, read whole in
this process) or a weights file (a warm start's ``.safetensors``); the config, generation
config and tokenizer from the run's model folder. The result loads with
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` anywhere:
safetensors in the chosen dtype (bf16 by default), written beside the target and renamed
into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from gyre_core.train.checkpoint import STATE_FILE, latest_checkpoint
from gyre_core.train.sharded import TRAINER_FILE, read_checkpoint

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def find_checkpoint(path: Path) -> Path:
    """``path`` itself (a checkpoint directory or a weights file), or a run folder's latest
    checkpoint."""
    if path.is_file() or (path / TRAINER_FILE).is_file():
        return path
    latest = latest_checkpoint(path / "checkpoints")
    if latest is None:
        raise ValueError(f"{path}: not a checkpoint, a weights file or a run folder with one")
    return latest


def default_model_dir(checkpoint: Path) -> Path:
    """The run's model folder beside its checkpoints (``<run>/checkpoints/step-N`` ->
    ``<run>/model``)."""
    model = checkpoint.parent.parent / "model"
    if not (model / "config.json").is_file():
        raise ValueError(f"{checkpoint}: no model folder at {model}; name one with --model-dir")
    return model


def read_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    if checkpoint.is_file():
        return load_file(str(checkpoint))
    if not (checkpoint / TRAINER_FILE).is_file() and not (checkpoint / STATE_FILE).is_file():
        raise ValueError(f"{checkpoint}: not a checkpoint (no {TRAINER_FILE})")
    weights: dict[str, torch.Tensor] = read_checkpoint(checkpoint)["model"]
    return weights


def export_hf(
    checkpoint: Path, model_dir: Path, out: Path, dtype: str = "bfloat16", force: bool = False
) -> Path:
    """Write ``checkpoint``'s weights with ``model_dir``'s config and tokenizer to ``out``
    (see the module docstring); returns ``out``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if out.exists() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} exists and is not empty (--force replaces it)")
    config: Any = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    weights = read_weights(checkpoint)
    model.load_state_dict(weights, strict=False, assign=True)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{checkpoint}: no weights for {', '.join(missing[:3])} in this model")
    model.tie_weights()
    model = model.to(DTYPES[dtype])
    model.config.dtype = dtype
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
