"""``gyre config`` and ``gyre run``: show, validate and run job configs.

gyre config show [--format yaml|json]     # the documented default (the CPU demo)
gyre config validate FILE                 # every bad field, by name
gyre run CONFIG [--json] [--workdir DIR] [--resume]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gyre_core.config import ConfigError, config_schema, default_config, dump_config, load_config

Sub = Any  # argparse's private _SubParsersAction


def register(groups: Sub) -> None:
    c = groups.add_parser("config", help="run configs: show the default, validate a file")
    cmds = c.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")
    s = cmds.add_parser("show", help="print the default config (the CPU demo)")
    s.add_argument("--format", choices=("yaml", "json", "schema"), default="yaml")
    s.set_defaults(func=cmd_show)
    v = cmds.add_parser("validate", help="check a config file; report every bad field")
    v.add_argument("file")
    v.set_defaults(func=cmd_validate)

    r = groups.add_parser("run", help="run a job from a config file")
    r.add_argument("config", help="JSON, YAML or TOML file (merged over the defaults)")
    r.add_argument("--workdir", help="checkpoints and logs (default .data/runs/NAME)")
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    r.add_argument("--events", help="also write every event to this JSONL file")
    r.add_argument("--json", action="store_true", help="last stdout line: the summary")
    r.set_defaults(func=cmd_run)


def cmd_show(args: argparse.Namespace) -> int:
    if args.format == "schema":
        print(json.dumps(config_schema(), indent=2))
    else:
        sys.stdout.write(dump_config(default_config(), args.format))
    return 0


def load(path: str) -> Any:
    try:
        return load_config(path)
    except ConfigError as exc:
        for field, problem in exc.errors:
            print(f"{path}: {field}: {problem}", file=sys.stderr)
        raise ValueError(f"{path}: {len(exc.errors)} bad field(s)") from None


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = load(args.file)
    print(f"{args.file}: ok (policy {cfg.policy}, {cfg.steps} steps, backend {cfg.backend})")
    return 0


class Progress:
    """One status line per event worth showing, on stderr (stdout stays for the summary)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, line: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {line}", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from gyre_core.events import JsonlSink, ListSink, TeeSink
    from gyre_core.runtime import run_job
    from gyre_core.runtime.progress import ProgressSink

    cfg = load(args.config)
    workdir = Path(args.workdir or Path(".data") / "runs" / cfg.name)
    progress = Progress()
    sinks: list[Any] = [ProgressSink(progress), ListSink()]
    fh = open(args.events, "a", encoding="utf-8") if args.events else None  # noqa: SIM115
    if fh:
        sinks.append(JsonlSink(fh))
    t0 = time.perf_counter()
    try:
        summary = run_job(
            cfg, sink=TeeSink(sinks), workdir=workdir, resume=args.resume, progress=progress
        )
    finally:
        if fh:
            fh.close()
    summary.setdefault("wall_s", round(time.perf_counter() - t0, 2))
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
    return 0 if summary.get("status") != "failed" else 1
