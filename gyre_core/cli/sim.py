"""``gyre sim``: synthetic workload traces, one simulated run, and the three policies compared.

    gyre sim workload --kind xlong --rollouts 512 --seed 0 --out trace.jsonl
    gyre sim run --workload trace.jsonl --policy elastic --gpus 128 [--events ev.jsonl]
    gyre sim compare --workload trace.jsonl --gpus 128 --costs costs.json

Every ``CostModel`` field is an option (``--train-tok-s 12000``); ``--costs`` loads a cost
table (JSON) and the options given explicitly override it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from gyre_core.cli import predict
from gyre_core.cli.common import positive_int
from gyre_core.cluster import Cluster, ClusterError
from gyre_core.events import JsonlSink
from gyre_core.jsonl import JsonBoundsError, loads
from gyre_core.scheduler import batching
from gyre_core.scheduler.policies import POLICIES, Async, fixed_split_policies, make_policy
from gyre_core.sim.checks import MODES
from gyre_core.sim.compare import compare
from gyre_core.sim.costs import CostError, CostModel
from gyre_core.sim.regime import describe as describe_regime
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import KINDS, describe, generate, read_trace, write_trace

Sub = Any  # argparse's private _SubParsersAction
COST_FIELDS = {f.name: f.type for f in fields(CostModel)}


class _OneLineParser(argparse.ArgumentParser):
    """Bad options are one line and exit 2, like every other error of ``gyre sim``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gyre: {self.prog.removeprefix('gyre ')}: {message}\n")


def register(groups: Sub) -> None:
    p = groups.add_parser("sim", help="cluster simulator: workloads, runs, policy comparison")
    cmds = p.add_subparsers(
        dest="cmd", required=True, metavar="SUBCOMMAND", parser_class=_OneLineParser
    )

    w = cmds.add_parser("workload", help="write a synthetic workload trace")
    w.add_argument("--kind", choices=KINDS, required=True)
    w.add_argument("--rollouts", type=positive_int, required=True)
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--group-size", type=positive_int, default=8, help="rollouts per GRPO group")
    w.add_argument("--out", required=True, help="the trace (JSONL, one rollout a line)")
    w.add_argument("--json", action="store_true", help="print one JSON object")
    w.set_defaults(func=cmd_workload)

    r = cmds.add_parser("run", help="simulate one policy on a trace")
    r.add_argument("--workload", required=True, metavar="TRACE")
    r.add_argument("--policy", choices=POLICIES, required=True)
    r.add_argument("--split", metavar="R:T", help="async: rollout units : training units")
    _batch_order(r)
    _cost_options(r)
    r.add_argument("--events", metavar="EVENTS.jsonl", help="write every event, one a line")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)

    c = cmds.add_parser("compare", help="colocate, async at its best split, and elastic")
    c.add_argument("--workload", required=True, metavar="TRACE")
    _batch_order(c)
    _cost_options(c)
    c.add_argument("--progress", action="store_true", help="one stderr line per simulation")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_compare)

    predict.register(cmds)


def _batch_order(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-order",
        choices=batching.ORDERS,
        default=batching.ARRIVAL,
        help="which finished rollouts a step trains (gyre_core/scheduler/batching.py); "
        "index: every policy trains the same rollouts in the same steps",
    )


def _cost_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--switch-mode", choices=MODES, default="migrate")
    g = p.add_argument_group("costs", "override the cost table (defaults: docs/sim-costs.md)")
    g.add_argument("--costs", metavar="COSTS.json", help="a cost table; options override it")
    defaults = CostModel()
    for name, annotation in COST_FIELDS.items():
        typ = int if str(annotation) == "int" else float
        g.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"cost_{name}",
            type=typ,
            default=None,
            metavar=typ.__name__.upper(),
            help=f"default {getattr(defaults, name)}",
        )


# --------------------------------------------------------------------------- inputs


def _costs(args: argparse.Namespace) -> CostModel:
    """The cost table: ``--costs`` if given, then every option given explicitly."""
    table: dict[str, Any] = _load_costs(args.costs) if args.costs else {}
    given = {n: getattr(args, f"cost_{n}") for n in COST_FIELDS}
    given = {n: v for n, v in given.items() if v is not None}
    try:
        return CostModel.from_json({**table, **given})
    except CostError as exc:
        message = str(exc)
        if args.costs and not any(f"--{n.replace('_', '-')}" in message for n in given):
            message = f"{args.costs}: {message}"  # the bad value is the file's
        raise ValueError(message) from None


def _load_costs(path: str) -> dict[str, Any]:
    try:
        obj = loads(Path(path).read_text(encoding="utf-8"))
    except JsonBoundsError as exc:
        raise ValueError(f"{path}:{exc.line}: <costs>: {exc.problem}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object of cost fields, got {_show(obj)}")
    for name, value in obj.items():
        if name not in COST_FIELDS:
            known = ", ".join(COST_FIELDS)
            raise ValueError(f"{path}: {name}: unknown cost field (known: {known})")
        want_int = str(COST_FIELDS[name]) == "int"
        ok = isinstance(value, int) if want_int else isinstance(value, int | float)
        if isinstance(value, bool) or not ok:
            kind = "an integer" if want_int else "a number"
            raise ValueError(f"{path}: {name}: expected {kind}, got {_show(value)}")
    return {k: v if str(COST_FIELDS[k]) == "int" else float(v) for k, v in obj.items()}


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _units(costs: CostModel) -> int:
    try:
        return len(Cluster(costs.gpus, costs.gpus_per_unit, costs.gpus_per_node))
    except ClusterError as exc:
        raise ValueError(
            f"--gpus {costs.gpus} --gpus-per-unit {costs.gpus_per_unit} "
            f"--gpus-per-node {costs.gpus_per_node}: {exc}"
        ) from None


SPLIT = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


def parse_split(text: str, units: int) -> tuple[int, int]:
    m = SPLIT.fullmatch(text)
    if m is None:
        raise ValueError(f"--split {text!r}: expected R:T, rollout units : training units")
    r, t = int(m.group(1)), int(m.group(2))
    if r < 1 or t < 1:
        raise ValueError(f"--split {r}:{t}: each side needs >= 1 unit")
    if r + t != units:
        raise ValueError(f"--split {r}:{t} does not add up to the cluster's {units} units")
    return r, t


# --------------------------------------------------------------------------- commands


def cmd_workload(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    trace = generate(args.kind, args.rollouts, args.seed, group_size=args.group_size)
    write_trace(args.out, trace)
    stats = describe(trace)
    if args.json:
        print(json.dumps({**stats, "out": args.out}, separators=(",", ":")))
        return 0
    print(f"{args.kind}: {len(trace)} rollouts -> {args.out}  ({time.perf_counter() - t0:.2f} s)")
    cols = ("p10", "p50", "p90", "p99", "max")
    print(f"{'':<18}" + "".join(f"{c:>12}" for c in cols))
    for key, value in stats.items():
        if isinstance(value, dict):
            print(f"{key:<18}" + "".join(f"{value[c]:>12,.1f}" for c in cols))
    for key, value in stats.items():
        if isinstance(value, float):
            print(f"{key:<18}{value:>12.3f}")
    print(f"next: gyre sim compare --workload {args.out}", file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    costs = _costs(args)
    units = _units(costs)
    split = None
    if args.split is not None:
        fixed = fixed_split_policies()
        if args.policy not in fixed:
            only = " or ".join(fixed)
            raise ValueError(f"--split applies to --policy {only} only, not {args.policy}")
        split = parse_split(args.split, units)
    trace = read_trace(args.workload)
    policy = make_policy(args.policy, units, split)
    t0 = time.perf_counter()
    if args.events:
        with open(args.events, "w", encoding="utf-8") as fh:
            summary = Simulator(
                trace,
                costs,
                policy,
                mode=args.switch_mode,
                batch_order=args.batch_order,
                sink=JsonlSink(fh),
            ).run()
    else:
        summary = Simulator(
            trace, costs, policy, mode=args.switch_mode, batch_order=args.batch_order
        ).run()
    if isinstance(policy, Async):
        summary["split"] = f"{policy.rollout_units}:{policy.train_units}"
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
        return 0
    summary["wall_s"] = round(time.perf_counter() - t0, 3)
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        print(f"{key:<{width}}  {_flat(value)}")
    return 0


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def cmd_compare(args: argparse.Namespace) -> int:
    costs = _costs(args)
    _units(costs)
    trace = read_trace(args.workload)
    show = args.progress or sys.stderr.isatty()
    t0 = time.perf_counter()

    def progress(line: str) -> None:
        print(f"gyre sim compare: {line}", file=sys.stderr, flush=True)

    result = compare(
        trace,
        costs,
        args.switch_mode,
        progress=progress if show else None,
        batch_order=args.batch_order,
    )
    if args.json:
        print(json.dumps(result, separators=(",", ":")))
        return 0
    _print_comparison(result, costs, args.switch_mode, time.perf_counter() - t0)
    return 0


COLUMNS = (
    ("split", 7),
    ("goodput_tok_s", 15),
    ("makespan_s", 13),
    ("tokens_trained", 16),
    ("timeouts", 10),
    ("efficiency", 12),
    ("tokens_masked", 15),
    ("role_switches", 15),
    ("calls_migrated", 16),
    ("sessions_restarted", 20),
)


def _print_comparison(result: dict[str, Any], costs: CostModel, mode: str, wall: float) -> None:
    e = result["elastic"]
    print(
        f"{e['rollouts']} rollouts, {e['steps']} steps of {costs.rollouts_per_step}, "
        f"{e['gpus']} GPUs in {e['units']} units, switch mode {mode}, "
        f"batch order {result['batch_order']}, lower bound {e['lower_bound_s']:,.1f} s"
    )
    print(f"{'policy':<9}" + "".join(f"{name:>{w}}" for name, w in COLUMNS))
    for policy in POLICIES:
        s = result[policy]
        cells = []
        for name, w in COLUMNS:
            v = s.get(name, "-")
            wide = name in ("makespan_s", "goodput_tok_s")
            cells.append(f"{v:>{w},.1f}" if wide else f"{v!s:>{w}}")
        print(f"{policy:<9}" + "".join(cells))
    splits = result["async_splits"]
    tried = ", ".join(
        f"{x['split']} {x['goodput_tok_s']:,.1f} tok/s ({x['timeouts']} timeouts)" for x in splits
    )
    print(f"async split {result['async']['split']}: the best of {len(splits)} tried ({tried})")
    q1 = result["async_first_quarter"]
    print(
        f"async split {q1['split']} (best on the first quarter of the trace): "
        f"{q1['goodput_tok_s']:,.1f} tok/s, {q1['timeouts']} timeouts"
    )
    print(f"regime    {describe_regime(result['regime'])}")
    terms = ", ".join(f"{k[:-2]} {v:,.1f} s" for k, v in e["bound_terms_s"].items())
    print(
        f"bound     {e['lower_bound_s']:,.1f} s ({terms}): no policy trains faster than "
        f"{result['ceiling_goodput_tok_s']:,.1f} tok/s, {result['ceiling_vs_async']:.4f}x async"
    )
    print(
        f"goodput   elastic vs colocate {result['elastic_vs_colocate']:.4f}x, "
        f"vs async {result['elastic_vs_async']:.4f}x, vs the first quarter's split "
        f"{result['elastic_vs_async_first_quarter']:.4f}x   (above 1: elastic trains faster)"
    )
    print(
        f"makespan  elastic vs colocate {result['makespan_vs_colocate']:.4f}x, "
        f"vs async {result['makespan_vs_async']:.4f}x   (above 1: elastic is done sooner)"
    )
    print(f"({wall:.1f} s to simulate)", file=sys.stderr)
