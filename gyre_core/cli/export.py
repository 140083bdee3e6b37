"""``gyre export``: a training checkpoint as a plain Hugging Face model directory.

gyre export CHECKPOINT OUT [--model-dir DIR] [--dtype bfloat16|float32|float16] [--force]

CHECKPOINT is a checkpoint directory (sharded or plain, ``gyre_core/train/export.py``) or a
run's work folder (then its newest checkpoint under ``checkpoints/``). The config and the
tokenizer come from ``--model-dir``, by default the run's ``model`` folder
(``CHECKPOINT/../../model``). Prints the directory written and its size.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

Sub = Any  # argparse's private _SubParsersAction
DTYPE_CHOICES = ("bfloat16", "float32", "float16")  # export.DTYPES, without importing torch


def register(groups: Sub) -> None:
    e = groups.add_parser("export", help="write a checkpoint as a Hugging Face model directory")
    e.add_argument("checkpoint", help="a checkpoint directory, or a run folder (its newest)")
    e.add_argument("out", help="directory to write (absent or empty, unless --force)")
    e.add_argument("--model-dir", help="config and tokenizer (default CHECKPOINT/../../model)")
    e.add_argument("--dtype", choices=DTYPE_CHOICES, default="bfloat16", help="weights' dtype")
    e.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    e.set_defaults(func=cmd_export)


def resolve(checkpoint: Path, model_dir: str | None) -> tuple[Path, Path]:
    """The checkpoint to export (``checkpoint`` itself, or a run folder's newest) and the
    model folder; a bad path raises ``ValueError`` naming it."""
    from gyre_core.train.export import DCP_METADATA, checkpoint_format, latest_exportable
    from gyre_core.train.trainer import WEIGHTS_FILE

    if not checkpoint.exists():
        raise ValueError(f"{checkpoint}: no such checkpoint or run folder")
    if not checkpoint.is_dir():
        raise ValueError(f"{checkpoint}: not a directory (give a checkpoint or a run folder)")
    if checkpoint_format(checkpoint) is None:
        root = checkpoint / "checkpoints"
        if not root.is_dir():
            holds = f"no {DCP_METADATA} or {WEIGHTS_FILE}, and no checkpoints/"
            raise ValueError(f"{checkpoint}: neither a checkpoint nor a run folder ({holds})")
        latest = latest_exportable(root)
        if latest is None:
            raise ValueError(f"{root}: no complete checkpoint to export")
        checkpoint = latest
    if model_dir is not None:
        return checkpoint, Path(model_dir)
    default = checkpoint.parent.parent / "model"
    if not (default / "config.json").is_file():
        raise ValueError(f"{checkpoint}: no run model folder at {default}; pass --model-dir DIR")
    return checkpoint, default


def cmd_export(args: argparse.Namespace) -> int:
    checkpoint, model_dir = resolve(Path(args.checkpoint), args.model_dir)
    out = Path(args.out)
    from transformers.utils import logging as hf_logging

    from gyre_core.train.export import export_hf, folder_bytes

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    export_hf(checkpoint, model_dir, out, args.dtype, force=args.force)
    size = folder_bytes(out)
    print(f"wrote {out}: {size / 1e6:.1f} MB ({size} bytes), {args.dtype}, from {checkpoint}")
    return 0
