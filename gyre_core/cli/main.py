"""``gyre``: the command-line entry point. Each command group lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gyre_core import __version__
from gyre_core.cli import export, model, run, sim, traj, warm_start


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gyre", description="Gyre: RL for long-horizon LLM agents"
    )
    parser.add_argument("--version", action="version", version=f"gyre {__version__}")
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    traj.register(groups)
    sim.register(groups)
    model.register(groups)
    run.register(groups)
    warm_start.register(groups)
    export.register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except (ValueError, OSError) as exc:  # bad input: one line, never a traceback
        print(f"gyre: {_one_line(exc)}", file=sys.stderr)
        return 2
    except RecursionError:  # the readers bound nesting; this is the last line of defence
        print("gyre: input nested too deep", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gyre: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
