"""``gyre export``: a run's checkpoint as a plain Hugging Face model directory.

gyre export CHECKPOINT OUT [--model-dir DIR] [--dtype bfloat16|float16|float32] [--force]

CHECKPOINT: a run checkpoint (``<run>/checkpoints/step-N``), a run folder (its latest
checkpoint) or a weights file; the config and tokenizer come from ``--model-dir``, by
default the run's ``model`` folder (train/export.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Sub = Any  # argparse's private _SubParsersAction


def register(groups: Sub) -> None:
    e = groups.add_parser("export", help="write a checkpoint as a Hugging Face model directory")
    e.add_argument("checkpoint", help="a run checkpoint, a run folder or a weights file")
    e.add_argument("out", help="the directory to write")
    e.add_argument("--model-dir", default="", help="config and tokenizer (default: the run's)")
    e.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    e.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    e.set_defaults(func=_export)


def _export(args: Any) -> int:
    from gyre_core.train.export import default_model_dir, export_hf, find_checkpoint, size_mb

    src = Path(args.checkpoint)
    if not src.exists():
        raise ValueError(f"{src}: no such checkpoint, run folder or weights file")
    checkpoint = find_checkpoint(src)
    if args.model_dir:
        model_dir = Path(args.model_dir)
    elif checkpoint.is_file():
        raise ValueError(f"{checkpoint}: a weights file needs --model-dir (config, tokenizer)")
    else:
        model_dir = default_model_dir(checkpoint)
    out = export_hf(checkpoint, model_dir, Path(args.out), args.dtype, args.force)
    print(f"{out}: {size_mb(out):.1f} MB ({args.dtype}, from {checkpoint})")
    return 0
