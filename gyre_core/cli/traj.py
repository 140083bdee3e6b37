"""``gyre traj``: statistics, packing and synthetic logs for ``gyre.trajectory/v1``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from typing import Any

from gyre_core.cli.common import positive_int
from gyre_core.train.config import TrainConfig
from gyre_core.trajectory.failures import step_figures
from gyre_core.trajectory.format import read_rollouts
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.paths import DEFAULT_ROLES, PathSampling, path_figures
from gyre_core.trajectory.rewards import ADVANTAGE_MODES, Weighting
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.synth import PRESETS, SynthConfig, synth_rollouts
from gyre_core.trajectory.tree import PrefixTree, build_trees
from gyre_core.trajectory.writer import write_rollouts

Sub = Any  # argparse's private _SubParsersAction


def register(groups: Sub) -> None:
    p = groups.add_parser("traj", help="trajectory logs: stats, pack, synth")
    cmds = p.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    s = cmds.add_parser("stats", help="dedup statistics of a gyre.trajectory/v1 file")
    s.add_argument("file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_stats)

    k = cmds.add_parser("pack", help="pack a log into training samples of bounded size")
    k.add_argument("file")
    k.add_argument("--max-tokens", type=positive_int, required=True, help="tokens per sample")
    k.add_argument("--out", required=True, help="output JSONL, one sample a line")
    k.add_argument(
        "--advantage-mode", choices=ADVANTAGE_MODES, default=TrainConfig().advantage_mode
    )
    k.add_argument("--normalise-std", action="store_true", help="divide advantages by group std")
    k.add_argument(
        "--max-paths", type=int, default=0, help="train.max_paths: paths per rollout (0 = all)"
    )
    k.add_argument("--path-roles", default=DEFAULT_ROLES, help="train.path_roles: role order")
    k.add_argument("--seed", type=int, default=0, help="the run seed of the draws")
    k.add_argument("--version", type=int, default=0, help="the policy version of the draws")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_pack)

    y = cmds.add_parser("synth", help="write a synthetic branching log")
    y.add_argument("--out", required=True)
    y.add_argument("--preset", choices=sorted(PRESETS), default="agentic")
    for f in fields(SynthConfig):
        y.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            type=_typ(f.type),
            default=None,
            help=f"override the preset's {f.name}",
        )
    y.add_argument("--json", action="store_true")
    y.set_defaults(func=cmd_synth)


def _typ(annotation: Any) -> Any:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return {"int": int, "float": float}.get(name.split("|")[0].strip(), str)


def _load(path: str) -> tuple[list[PrefixTree], float]:
    t0 = time.perf_counter()
    trees = list(build_trees(read_rollouts(path)).values())
    return trees, time.perf_counter() - t0


def _emit(obj: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, separators=(",", ":")))
        return
    width = max(len(k) for k in obj)
    for key, value in obj.items():
        print(f"{key:<{width}}  {value}")


def cmd_stats(args: argparse.Namespace) -> int:
    trees, secs = _load(args.file)
    stats = tree_stats(trees)
    if not args.json:
        stats["build_s"] = round(secs, 3)
    _emit(stats, args.json)
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    try:
        if args.max_paths < 0:
            raise ValueError(f"--max-paths must be >= 0, got {args.max_paths}")
        sampling = PathSampling.of(args.max_paths, args.path_roles)
    except ValueError as e:
        print(f"gyre traj pack: {e}", file=sys.stderr)
        return 2
    rollouts = list(read_rollouts(args.file))
    by_group = Weighting(args.advantage_mode, args.normalise_std).trees(rollouts)
    trees = list(by_group.values())
    unique = 0
    for t in trees:
        sampling.apply(t, args.seed, args.version)
        unique += t.tokens_unique
    samples = pack_trees(trees, args.max_tokens)
    packed = sum(len(s) for s in samples)
    figures = {k: int(v) for k, v in step_figures(rollouts, by_group, args.max_tokens).items()}
    laid = unique - figures["tokens_cut"]  # the positions packing lays out
    with open(args.out, "w", encoding="utf-8") as fh:
        for s in samples:
            fh.write(json.dumps(s.to_json(), separators=(",", ":")) + "\n")
    _emit(
        {
            "samples": len(samples),
            "max_tokens": args.max_tokens,
            "tokens_unique": unique,
            "tokens_packed": packed,
            "trainable_tokens": int(sum(int(s.trainable.sum()) for s in samples)),
            "packing_overhead": round(packed / laid - 1, 4) if laid else 0.0,
            "largest_sample": max((len(s) for s in samples), default=0),
            "advantage_mode": args.advantage_mode,
            "max_paths": args.max_paths,
            **{k: int(v) for k, v in path_figures(trees).items()},
            **figures,
        },
        args.json,
    )
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    cfg = PRESETS[args.preset]
    overrides = {f.name: getattr(args, f.name) for f in fields(SynthConfig)}
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    t0 = time.perf_counter()
    n = write_rollouts(args.out, synth_rollouts(cfg), compress=False)
    _emit(
        {"rollouts": n, "out": args.out, "seconds": round(time.perf_counter() - t0, 3)}, args.json
    )
    if not args.json:
        print(f"next: gyre traj stats {args.out}", file=sys.stderr)
    return 0
