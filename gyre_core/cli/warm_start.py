"""``gyre warm-start``: run a config's supervised warm start once and keep its weights.

gyre warm-start CONFIG --out W.safetensors [--set SECTION.FIELD=VALUE ...] [--every N]
    [--workdir DIR]

Writes the weights (safetensors) and a JSON of the same stem beside them
(runtime/warm_file.py); a run with ``warm_start.weights: W.safetensors`` begins from them.
Progress (model build, warm-start steps, benchmarks) goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gyre_core.cli.common import apply_overrides, positive_int

Sub = Any  # argparse's private _SubParsersAction


def register(groups: Sub) -> None:
    w = groups.add_parser("warm-start", help="run a config's warm start; write its weights")
    w.add_argument("config", help="JSON, YAML or TOML file (merged over the defaults)")
    w.add_argument("--out", required=True, help="weights file to write (.safetensors)")
    w.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field (repeatable)",
    )
    w.add_argument(
        "--every",
        type=positive_int,
        default=None,
        metavar="N",
        help="score the greedy held-out benchmark every N steps",
    )
    w.add_argument("--workdir", help="where the model is built (default .data/warm-start/NAME)")
    w.set_defaults(func=cmd_warm_start)


def cmd_warm_start(args: argparse.Namespace) -> int:
    from gyre_core.cli.run import Progress, load
    from gyre_core.config import RunConfig, resolve_paths
    from gyre_core.runtime.progress import ProgressSink
    from gyre_core.runtime.warm_file import write_warm_start
    from gyre_core.runtime.warm_start import missed_message

    cfg = load(args.config)
    if args.set:
        data = cfg.to_dict()
        apply_overrides(data, args.set)
        cfg = resolve_paths(RunConfig.from_dict(data), Path.cwd())
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise ValueError(f"--out {out}: give a .safetensors file (its JSON goes beside it)")
    progress = Progress()
    workdir = Path(args.workdir or Path(".data") / "warm-start" / cfg.name)
    meta = write_warm_start(
        cfg, out, workdir=workdir, every=args.every or 0, sink=ProgressSink(progress), say=progress
    )
    last = meta["losses"][-1] if meta["losses"] else float("nan")
    print(
        f"wrote {out} and {out.with_suffix('.json')}: {meta['steps']} steps, "
        f"last loss {last:.3f}, {meta['seconds']:.0f} s",
        file=sys.stdout,
    )
    if meta["missed_target"] is not None:
        print(missed_message(meta["missed_target"], meta["missed_field"]), file=sys.stderr)
        return 3
    return 0
