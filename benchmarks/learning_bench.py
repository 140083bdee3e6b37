"""Learning on CPU: ``gyre run`` on the learning demo under each policy (and the binary-reward
ablation), then the held-out benchmark re-scored at checkpoints along the way.

For each run it prints the per-step curve of training progress (mean progress of the step's
rollouts), the benchmark at every ``--every``-th checkpoint (greedy, the run's own benchmark
tasks, scored in this process from the saved weights; ``--bench-tasks`` scores more tasks,
``--bench-samples K`` the mean of K sampled sessions a task), before/after, and wall times.
``--rescore FILE`` trains nothing and scores the runs an earlier ``--out FILE`` holds again.

    python benchmarks/learning_bench.py [--runs elastic,colocate,async,elastic-binary]
        [--steps 48] [--every 8] [--bench-tasks 48] [--bench-samples 4]
        [--set rollout.temperature=0.7 ...] [--out .data/bench/learning.json]
    python benchmarks/learning_bench.py --rescore .data/bench/learning.json --every 4
        [--bench-tasks 48] [--bench-samples 4] --out .data/bench/rescored.json

A run name is ``<policy>``, ``<policy>-binary`` (``rollout.reward: binary``, the ablation) or
``<policy>-restart`` (``scheduler.switch_mode: restart``), optionally with ``@k`` to run the
same config again (``colocate,colocate@2``: the reproducibility check; runs that differ only
in ``@k`` are compared at the end: their curves, and their weights at every checkpoint).
Every run reads ``configs/learn-<policy>.yaml``.
``gyre run`` runs in a child process (its own Ray).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gyre_core.cli.common import apply_overrides

ROOT = Path(__file__).resolve().parent.parent


def run_one(
    name: str, steps: int | None, out_dir: Path, sets: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Path, Path]:
    policy, _, variant = name.split("@")[0].partition("-")
    data = yaml.safe_load((ROOT / "configs" / f"learn-{policy}.yaml").read_text())
    apply_overrides(data, sets)
    data["name"] = f"learn-{name.replace('@', '-')}"
    if steps:
        data["steps"] = steps
    if variant == "binary":
        data.setdefault("rollout", {})["reward"] = "binary"
    elif variant == "restart":
        data.setdefault("scheduler", {})["switch_mode"] = "restart"
    elif variant:
        raise SystemExit(f"unknown run variant {variant!r} in {name!r}")
    work = out_dir / name.replace("@", "-")
    shutil.rmtree(work / "run", ignore_errors=True)  # no checkpoint of an earlier run stays
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "gyre_core.cli.main", "run", str(cfg_path), "--json",
           "--workdir", str(work / "run")]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: gyre run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["process_wall_s"] = round(time.perf_counter() - t0, 1)
    summary["name"], summary["workdir"] = name, str(work / "run")
    return summary, cfg_path, work / "run"


def bench_curve(
    cfg_path: Path, workdir: Path, every: int, tasks: int = 0, samples: int = 0
) -> dict[int, float]:
    """The run's benchmark, re-scored from its checkpoints at versions every, 2*every, ...

    ``tasks`` > 0 scores that many held-out tasks instead of the run's own
    ``rollout.benchmark_tasks`` (the first of them are the run's own), and version 0 too
    when the run started from ``warm_start.weights``. ``samples`` > 0 scores the mean
    of that many sampled sessions a task instead of one greedy one
    (``gyre_core.runtime.benchmark``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gyre_core.config import load_config
    from gyre_core.events import NullSink
    from gyre_core.rollout.router import Router
    from gyre_core.rollout.torch_engine import TorchEngine
    from gyre_core.runtime.benchmark import benchmark
    from gyre_core.runtime.session import SessionFactory, make_model_dir
    from gyre_core.train.checkpoint_dirs import checkpoints

    cfg = load_config(cfg_path)
    if tasks:
        cfg = replace(cfg, rollout=replace(cfg.rollout, benchmark_tasks=tasks))
    model_dir = make_model_dir(cfg, workdir)
    factory = SessionFactory(cfg, model_dir, NullSink(), lambda: 0.0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    weights = list(checkpoints(workdir / "checkpoints"))
    if tasks and cfg.warm_start.weights:
        weights.insert(0, (0, Path(cfg.warm_start.weights)))
    curve = {}
    for version, path in weights:
        if version % every:
            continue
        model.load_state_dict(_weights(path))
        router = Router({"local": TorchEngine(model)})
        curve[version] = asyncio.run(benchmark(factory, router, version, samples=samples))
    return curve


def compare_repeats(rows: list[dict[str, Any]]) -> None:
    """For runs of the same config (names differing only in ``@k``): the largest per-step
    difference of their training-progress and benchmark curves."""
    first: dict[str, dict[str, Any]] = {}
    for row in rows:
        base = row["name"].split("@")[0]
        if base not in first:
            first[base] = row
            continue
        a, b = first[base], row
        prog = [
            abs(x - y) for x, y in zip(a["progress_by_step"], b["progress_by_step"], strict=False)
        ]
        bench = [abs(a["benchmark_curve"][v] - b["benchmark_curve"][v])
                 for v in a["benchmark_curve"] if v in b["benchmark_curve"]]  # fmt: skip
        print(f"repeat {a['name']} vs {b['name']}: max |diff| train progress "
              f"{max(prog, default=0.0):.4f}, benchmark {max(bench, default=0.0):.4f} "
              f"(after: {a['benchmark_after']:.3f} vs {b['benchmark_after']:.3f}); "
              f"{weights_diff(Path(a['workdir']), Path(b['workdir']))}")  # fmt: skip


def compare_to_colocate(rows: list[dict[str, Any]]) -> None:
    """For each run of another policy: the largest per-version difference of its benchmark
    curve from the first colocate run of the same variant (``elastic-binary`` against
    ``colocate-binary``), where both scored that version."""
    colocate: dict[str, dict[str, Any]] = {}
    for row in rows:
        policy, _, variant = row["name"].split("@")[0].partition("-")
        if policy == "colocate":
            colocate.setdefault(variant, row)
    for row in rows:
        policy, _, variant = row["name"].split("@")[0].partition("-")
        ref = colocate.get(variant)
        if policy == "colocate" or ref is None:
            continue
        diffs = {v: row["benchmark_curve"][v] - ref["benchmark_curve"][v]
                 for v in row["benchmark_curve"] if v in ref["benchmark_curve"]}  # fmt: skip
        worst = max(diffs, key=lambda v: abs(diffs[v]), default=None)
        text = f"{diffs[worst]:+.3f} at v{worst}" if worst is not None else "no common versions"
        print(f"{row['name']} vs {ref['name']}: largest benchmark difference {text}; by version "
              + " ".join(f"v{v}:{d:+.3f}" for v, d in diffs.items()))  # fmt: skip


def earlier_runs(path: str) -> list[tuple[dict[str, Any], Path, Path]]:
    """The runs an earlier ``--out`` file holds, with their configs and work folders."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--rescore {path}: {e}") from None
    return [(row, Path(row["workdir"]).parent / "config.yaml", Path(row["workdir"]))
            for row in rows]  # fmt: skip


def _weights(path: Path) -> dict[str, Any]:
    """The weights of a run's checkpoint (sharded or plain) or of a weights file."""
    from safetensors.torch import load_file

    from gyre_core.train.export import checkpoint_weights

    return load_file(str(path)) if path.is_file() else checkpoint_weights(path)


def weights_diff(a: Path, b: Path) -> str:
    """The largest weight difference of two runs at each checkpoint both saved."""
    from gyre_core.train.checkpoint_dirs import checkpoints

    theirs = dict(checkpoints(b / "checkpoints"))
    parts = []
    for version, ck in checkpoints(a / "checkpoints"):
        if version not in theirs:
            continue
        wa, wb = _weights(ck), _weights(theirs[version])
        diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        parts.append(f"v{version}:{diff:.1e}" if diff else f"v{version}:identical")
    return "weights " + (" ".join(parts) or "(no common checkpoints)")


def _paths(summary: dict[str, Any]) -> str:
    """The run's path accounting (``train.max_paths``): paths and generated tokens trained
    of those stored, summed over its steps."""
    p = summary.get("paths") or {}
    if not p:
        return "(not recorded)"
    return (f"{p['paths_taken']:.0f}/{p['paths_total']:.0f}, generated tokens "
            f"{p['tokens_trained']:.0f}/{p['tokens_stored']:.0f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="", help="default: elastic,colocate,async,elastic-binary")
    ap.add_argument("--steps", type=int, default=0, help="override the configs' steps (0: keep)")
    ap.add_argument("--every", type=int, default=8, help="re-score the benchmark every k steps")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field in every run (repeatable)",
    )
    ap.add_argument("--bench-tasks", type=int, default=0,
                    help="re-score on this many held-out tasks (0: the run's own)")  # fmt: skip
    ap.add_argument("--bench-samples", type=int, default=0,
                    help="re-score as the mean of K sampled sessions a task (0: greedy)")  # fmt: skip
    ap.add_argument("--rescore", metavar="FILE",
                    help="train nothing: re-score the runs of an earlier --out FILE")  # fmt: skip
    ap.add_argument("--out", default=str(ROOT / ".data" / "bench" / "learning.json"))
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: one elastic run of 2 RL steps on a 20-step warm start, uncached",
    )
    args = ap.parse_args()
    if args.quick and not args.rescore:
        args.runs, args.steps, args.every = args.runs or "elastic", 2, 2
        quick = ["warm_start.steps=20", "warm_start.anneal_steps=0"]
        args.set = [*quick, "warm_start.cache=''", "checkpoint_every=2", *args.set]
    args.runs = args.runs or "elastic,colocate,async,elastic-binary"
    if args.bench_samples < 0:
        raise SystemExit(f"--bench-samples must be >= 0, got {args.bench_samples}")
    out_dir = Path(args.out).parent / "learning"
    print(f"loadavg at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    if args.rescore and not args.every:
        raise SystemExit("--rescore needs --every k > 0 (the versions to score)")
    runs: Iterable[tuple[dict[str, Any], Path, Path]] = (
        earlier_runs(args.rescore)
        if args.rescore
        else (
            run_one(n, args.steps or None, out_dir, tuple(args.set)) for n in args.runs.split(",")
        )
    )
    rows = []
    for s, cfg_path, work in runs:  # each run is scored and printed as soon as it ends
        t0 = time.perf_counter()
        curve = (bench_curve(cfg_path, work, args.every, args.bench_tasks, args.bench_samples)
                 if args.every else {})  # fmt: skip
        s["benchmark_curve"] = curve
        s["benchmark_scoring"] = {"every": args.every, "tasks": args.bench_tasks,
                                  "samples": args.bench_samples}  # fmt: skip
        rows.append(s)
        prog = " ".join(f"{p:.2f}" for p in s.get("progress_by_step", []))
        bench = " ".join(f"{v}:{b:.3f}" for v, b in curve.items())
        print(
            f"{s['name']:15} benchmark {s['benchmark_before']:.3f} -> {s['benchmark_after']:.3f} "
            f"(gain {s['benchmark_after'] - s['benchmark_before']:+.3f})  steps {s['steps']}  "
            f"warm start {s.get('warm_start_s', 0.0):.0f} s  RL {s.get('rl_wall_s', 0.0):.0f} s  "
            f"wall {s['wall_s']:.0f} s\n  train progress by step: {prog}\n"
            f"  train s/step {s.get('train_s_mean', 0.0):.3f}  paths {_paths(s)}\n"
            f"  benchmark by version: {bench} (scored in {time.perf_counter() - t0:.0f} s)\n"
            f"  loadavg: {Path('/proc/loadavg').read_text().strip()}",
            flush=True,
        )
    compare_repeats(rows)
    compare_to_colocate(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
