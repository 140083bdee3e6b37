"""``gyre sim predict WORKDIR``: the simulator's prediction of a finished real run.

A real run writes ``costs.json`` (its measured cost table), ``workload.jsonl`` (its own
rollouts as a trace) and ``calibration.json`` (its policy and measured loop time) into its
work folder (``gyre_core.runtime.calibrate``). This command simulates that policy on that
table and workload and prints the predicted makespan beside the measured time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gyre_core.scheduler.policies import POLICIES


def register(cmds: Any) -> None:
    p = cmds.add_parser(
        "predict",
        help="predict a finished real run's wall time from its own measured costs and workload",
    )
    p.add_argument("workdir", metavar="WORKDIR", help="the real run's work folder")
    p.add_argument("--policy", choices=POLICIES, help="simulate this policy instead of the run's")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from gyre_core.runtime.calibrate import predict

    out = predict(Path(args.workdir), policy=args.policy)
    if args.json:
        print(json.dumps(out, separators=(",", ":")))
        return 0
    err = out["error"]
    print(f"policy        {out['policy']}  ({out['steps']} steps, {out['rollouts']} rollouts)")
    print(f"predicted     {out['predicted_s']:.2f} s")
    print(f"measured      {out['actual_s']:.2f} s")
    print(f"error         {'-' if err is None else f'{err:+.1%}'}")
    print(f"compared      {out['compared']}")
    return 0
