"""``gyre config`` and ``gyre run``: show, validate and run job configs.

gyre config show [--format yaml|json]     # the documented default (the CPU demo)
gyre config validate FILE                 # every bad field, by name
gyre run CONFIG [--json] [--workdir DIR] [--resume]
         [--report-to URL --experiment ID [--token KEY]]   # live on the platform too
gyre report WORKDIR [--token KEY]          # send a reported run's events still unsent
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gyre_core.config import ConfigError, config_schema, default_config, dump_config, load_config

Sub = Any  # argparse's private _SubParsersAction
TOKEN_ENV = "GYRE_TOKEN"


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
    r.add_argument(
        "--report-to", metavar="URL", help="also report the run live to this Gyre platform"
    )
    r.add_argument("--experiment", type=int, help="--report-to: the experiment's id")
    r.add_argument("--token", help=f"--report-to: an API token (default ${TOKEN_ENV})")
    r.set_defaults(func=cmd_run)

    p = groups.add_parser("report", help="send a reported run's events still unsent")
    p.add_argument("workdir", help="the run's folder (it holds report.json)")
    p.add_argument("--token", help=f"an API token (default ${TOKEN_ENV})")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to keep trying")
    p.set_defaults(func=cmd_report)


def cmd_show(args: argparse.Namespace) -> int:
    if args.format == "schema":
        print(json.dumps(config_schema(), indent=2))
    elif args.format == "yaml":
        sys.stdout.write(with_choices(dump_config(default_config(), "yaml")))
    else:
        sys.stdout.write(dump_config(default_config(), args.format))
    return 0


def with_choices(text: str) -> str:
    """The default config's YAML with each field that takes one of a few names followed by
    them as a comment (``loss: ppo  # ppo | decoupled | pg``); it still loads as it was."""
    schema, section, out = config_schema(), "", []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        name = line.strip().split(":", 1)[0]
        if indent == 0:
            section = name
        path = f"{section}.{name}" if indent else name
        choices = schema.get(path, {}).get("choices")
        out.append(f"{line}  # {' | '.join(choices)}" if choices else line)
    return "\n".join(out) + "\n"


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
    reporter = _reporter(args, cfg, workdir, progress)
    if reporter is not None:
        sinks.append(reporter)
    t0 = time.perf_counter()
    try:
        summary = run_job(
            cfg,
            sink=TeeSink(sinks),
            workdir=workdir,
            resume=args.resume,
            progress=progress,
            should_stop=reporter.should_stop if reporter is not None else lambda: False,
        )
    finally:
        if fh:
            fh.close()
        if reporter is not None:
            _left(reporter.close(), workdir)
    summary.setdefault("wall_s", round(time.perf_counter() - t0, 2))
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
    return 0 if summary.get("status") != "failed" else 1


def _token(args: argparse.Namespace) -> str:
    token = args.token or os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ValueError(f"--token or ${TOKEN_ENV}: an API token of the platform is needed")
    return str(token)


def _reporter(args: argparse.Namespace, cfg: Any, workdir: Path, progress: Progress) -> Any:
    """The run's Reporter when ``--report-to`` is given (the platform run created, or the
    one this folder reported to before)."""
    from gyre_core.runtime.report import Platform, Reporter, attach

    if not args.report_to:
        return None
    if args.experiment is None:
        raise ValueError("--report-to needs --experiment ID (the experiment the run goes in)")
    platform = Platform(args.report_to, _token(args))
    run_id = attach(
        platform,
        workdir,
        experiment=args.experiment,
        config=cfg.to_dict(),
        name=cfg.name,
        resume=args.resume,
    )
    progress(f"reporting to {platform.url}/runs/{run_id}")
    return Reporter(platform, run_id, workdir, say=progress)


def _left(unsent: int, workdir: Path) -> None:
    if unsent:
        print(
            f"{unsent} events not reported yet (the platform is unreachable); they are kept "
            f"in {workdir}: send them with `gyre report {workdir}`",
            file=sys.stderr,
        )


def cmd_report(args: argparse.Namespace) -> int:
    from gyre_core.runtime.report import STATE, Platform, Reporter

    workdir = Path(args.workdir)
    state_file = workdir / STATE
    if not state_file.exists():
        raise ValueError(f"{workdir}: no {STATE}: this folder never reported to a platform")
    state = json.loads(state_file.read_text())
    reporter = Reporter(Platform(state["url"], _token(args)), int(state["run"]), workdir)
    unsent = reporter.close(wait_s=args.wait)
    _left(unsent, workdir)
    print(f"run {state['run']}: {reporter.acked} events reported, {unsent} left")
    return 0 if not unsent else 1
