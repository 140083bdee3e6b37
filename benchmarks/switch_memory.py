"""A switch's peak memory on the CPU: what a process that stays in training holds while the
group re-forms around it, against what it holds between steps.

``--units`` training units of ``--per-unit`` processes (gloo, real processes, one
:class:`~gyre_core.train.member.TrainMember` each, no Ray) train a randomly initialised
model of a named shape (``gpu_suite_common.SHAPES``; ``--layers`` keeps that many of its decoder
layers, the widths unchanged) in fp32: a step (weights, gradients and AdamW moments all
held), then unit 1 leaves (a switch), a step, then unit 1 joins again (a switch: it
receives its shards from unit 0), a step. A thread in each process reads its resident set
(``/proc/self/statm``) every millisecond during each switch; *steady* is the resident set
just before the switch (after the step before it). Large allocations go straight to the
OS (``MALLOC_MMAP_THRESHOLD_``), so freed memory leaves the resident set.

It prints, for each switch, the staying processes' steady and peak resident sets and
their ratio (the target: at most 1.10), the joining processes' peak (over their whole
wait: they wait for the others' step), and the staying processes' seconds.

    .venv/bin/python benchmarks/switch_memory.py --shape 0.6b --layers 8   # ~4 min, ~6 GB
    .venv/bin/python benchmarks/switch_memory.py --shape tiny              # seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))  # read by each spawned process

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_suite_common import SHAPES, agentic_batch, model_config
from gyre_core.models.model import build_model
from tests.train.members import Place, free_port, member_for, step

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Peak:
    """The highest resident set seen while the block runs (a thread samples it)."""

    def __enter__(self) -> Peak:
        self.peak, self.done = rss(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.done.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, rss())


def _process(index: int, args: argparse.Namespace, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    place = Place(index, args.per_unit, port)
    place.open_store()
    member, plan, bound = member_for(model_dir)
    vocab = member_vocab(model_dir)
    widths = [list(range(args.units)), [0], list(range(args.units))]
    figures: list[dict[str, Any]] = []
    for n, units in enumerate(widths):
        spec = place.spec(units, n, "init" if n == 0 else "keep", replica=0 if n == 2 else -1)
        gc.collect()
        steady = rss()
        t0 = time.perf_counter()
        with Peak() as peak:
            if spec is None:
                member.leave()
            else:
                place.form(member, spec)
        row = {"switch": n, "process": index, "steady_rss": steady, "peak_rss": peak.peak,
               "seconds": time.perf_counter() - t0,
               "role": "leaves" if spec is None else "joins" if n and not figures[-1]["in"] else "stays",
               "in": spec is not None}  # fmt: skip
        figures.append(row)
        if spec is not None:
            batch = agentic_batch(vocab, quick=True, groups=1)  # version 0: the same work
            step(member, plan, bound, batch, 0, spec.rank, len(units) * args.per_unit)
    Path(f"{out}.{index}").write_text(json.dumps(figures))
    member.leave()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads may still hold tensors at teardown; the figures are written


def member_vocab(model_dir: str) -> int:
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers kept (0: the shape's)")
    ap.add_argument("--vocab", type=int, default=32_768)
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--per-unit", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gyre-switch-mem-") as tmp:
        config = model_config(args.shape, args.vocab)
        if args.layers:
            config.num_hidden_layers = args.layers
            config.layer_types = config.layer_types[: args.layers]
        model = build_model(config)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(Path(tmp) / "model")
        del model
        out = str(Path(tmp) / "figures")
        world = args.units * args.per_unit
        mp.spawn(_process, args=(args, free_port(), str(Path(tmp) / "model"), out), nprocs=world)
        rows = [r for i in range(world) for r in json.loads(Path(f"{out}.{i}").read_text())]
    report(args, params, rows)


def report(args: argparse.Namespace, params: int, rows: list[dict[str, Any]]) -> None:
    gib = 2**30
    print(f"{args.shape} shape, {args.layers or 'all'} layers, {params / 1e6:.1f}M parameters, "
          f"{args.units} units x {args.per_unit} processes, fp32")  # fmt: skip
    summary = []
    for n, name in ((1, "unit 1 leaves"), (2, "unit 1 joins")):
        stay = [r for r in rows if r["switch"] == n and r["role"] == "stays"]
        join = [r for r in rows if r["switch"] == n and r["role"] == "joins"]
        ratio = max(r["peak_rss"] / r["steady_rss"] for r in stay)
        line = {"switch": name, "ratio": round(ratio, 3),
                "steady_gib": round(max(r["steady_rss"] for r in stay) / gib, 3),
                "peak_gib": round(max(r["peak_rss"] for r in stay) / gib, 3),
                "join_peak_gib": round(max((r["peak_rss"] for r in join), default=0) / gib, 3),
                "seconds": round(max(r["seconds"] for r in stay), 2)}  # fmt: skip
        summary.append(line)
        print(f"  {name}: staying processes steady {line['steady_gib']:.2f} GiB, peak "
              f"{line['peak_gib']:.2f} GiB (x{ratio:.3f}); joining processes' peak "
              f"{line['join_peak_gib']:.2f} GiB; the staying processes' switch "
              f"{line['seconds']:.1f} s")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"parameters": params, "summary": summary, "rows": rows}))


if __name__ == "__main__":
    main()
