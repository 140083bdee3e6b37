"""``gyre model``: build local checkpoints (tokenizer + random weights) without a hub."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from gyre_core.cli.common import positive_int
from gyre_core.models.shape import ModelShape

Sub = Any  # argparse's private _SubParsersAction


def register(groups: Sub) -> None:
    p = groups.add_parser("model", help="local model checkpoints: init")
    cmds = p.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    i = cmds.add_parser("init", help="train a byte-level BPE and write a random Qwen3 (or MoE)")
    i.add_argument("--out", required=True, help="checkpoint directory (must be empty or absent)")
    for f in fields(ModelShape):
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            i.add_argument(flag, action="store_true", help=f.metadata["help"])
        else:
            kind = positive_int if f.metadata.get("min", 1) >= 1 else _count
            i.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--corpus", help="UTF-8 text file to train the tokenizer on (one document)")
    i.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_init)


def _count(text: str) -> int:
    """A whole number >= 0 (``--experts 0``: a dense model)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def cmd_init(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    if out_dir.is_dir() and any(out_dir.iterdir()) and not args.overwrite:
        # Checked before the heavy imports below, so a refusal costs no torch start-up;
        # init_checkpoint checks again with the same message.
        raise ValueError(f"{out_dir}: directory is not empty (pass --overwrite)")
    # Imported here so that `gyre traj ...` does not pay for importing torch/transformers.
    from transformers.utils import logging as hf_logging

    from gyre_core.models.init import MANIFEST, init_checkpoint

    # "Writing model shards" would clutter stderr; transformers leaves this unannotated.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    corpus = None if args.corpus is None else [Path(args.corpus).read_text(encoding="utf-8")]
    t0 = time.perf_counter()
    shape = ModelShape(**{f.name: getattr(args, f.name) for f in fields(ModelShape)})
    out = init_checkpoint(args.out, shape, seed=args.seed, corpus=corpus, overwrite=args.overwrite)
    manifest = json.loads((out / MANIFEST).read_text())
    weight_bytes = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    summary = {
        "out": str(out),
        "vocab_size": manifest["tokenizer"]["vocab_size"],
        "layers": args.layers,
        "hidden": args.hidden,
        "safetensors_bytes": weight_bytes,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
        print(f"next: AutoModelForCausalLM.from_pretrained({str(out)!r})", file=sys.stderr)
    return 0
