"""The device check: what one GPU machine with only PyTorch, transformers and Triton (no Ray,
no vLLM, no model hub: models are built from their shapes with random weights) can tell of
Gyre's GPU path, in one run of a few minutes.

Prints one JSON line per section on stdout; the first (``env``) gives the versions (torch,
CUDA, cuDNN, NCCL, transformers, Triton), the device and its memory, and what Triton needs
to compile kernels (a C compiler, ``Python.h``). Then each section, isolated (a failure
prints its error and the tail of its traceback, and the next section runs) and timed:

* ``train.<shape>.<attention>``: one training step of a training unit of one process
  (``ShardedTrainer``: FSDP2, bf16 compute over fp32 master weights on CUDA, NCCL; fp32 and
  gloo on the CPU) on a synthetic agentic batch, for Qwen3-0.6B's and Qwen3-1.7B's shapes,
  with the dense tree mask and with the block-sparse tree path (flex attention on CUDA,
  Gyre's sparse kernel on the CPU, which has no flex backward). A warm-up step first (flex
  compiles there; a graph compiled in the timed steps fails the section), then timed steps:
  tokens/s, MFU (decoder matmuls, output head and tree-masked attention; no embedding) and
  the 6N figure beside it, peak device memory.
* ``precision.<shape>``: the first step's loss in bf16 against fp32, same batch and weights.
* ``handover.<shape>``: the bf16 weight hand-over from the FSDP2 shards to a second process
  (CUDA IPC on a GPU, shared memory on the CPU), the whole route timed
  (``gpu_suite_handover.py``).
* ``tree_vs_linear.<shape>``: forward and backward over the ``agentic`` preset tree-packed
  against per-branch linear sequences; goal: a speedup of at least 0.8 x the ratio of
  their token counts.
* ``streaming.<shape>``: the streaming core on the device (``gpu_suite_streaming.py``): a
  step fed as it runs against the plain step, and the optimizer state parked in pinned
  host memory and back, bit for bit and where AdamW keeps it.

A markdown table of the sections goes to stderr at the end (for docs/benchmarks.md). The
exit code is 0 when every section passed.

    python benchmarks/gpu_suite.py                       # on CUDA: under 8 minutes on an H100
    python benchmarks/gpu_suite.py --sections env,train.0.6b --json-out suite.jsonl
    python benchmarks/gpu_suite.py --quick               # tiny shapes on the CPU (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_suite_common import QWEN3_VOCAB, peak_tflops
from benchmarks.gpu_suite_handover import weight_handover
from benchmarks.gpu_suite_sections import (
    GIB,
    Context,
    precision_agreement,
    train_step,
    tree_vs_linear,
)
from benchmarks.gpu_suite_streaming import streaming_core

Section = tuple[str, Callable[[], dict[str, Any]]]
SUMMARY_KEYS = (
    "tokens_per_s", "mfu", "mfu_6n", "peak_mem_gib", "loss_bf16", "loss_fp32", "rel_diff",
    "median_s", "bytes_bf16", "gb_per_s", "dedup_ratio", "speedup", "speedup_over_dedup",
    "stream_s", "plain_s", "offload_s", "restore_s", "error",
)  # fmt: skip


def c_compiler() -> str | None:
    """The C compiler Triton builds its launchers with: ``$CC``, else gcc, else clang."""
    cc = os.environ.get("CC")
    return shutil.which(cc) if cc else shutil.which("gcc") or shutil.which("clang")


def env_info(device: torch.device) -> dict[str, Any]:
    """Versions, the device, and what Triton needs; ``ok``: all this device's path needs."""
    import transformers

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    out: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "triton": triton_version, "c_compiler": c_compiler(),
        "python_h": str(header) if header.exists() else None, "device": str(device),
    }  # fmt: skip
    missing = [k for k in ("triton", "c_compiler", "python_h") if out[k] is None]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        out.update(
            cudnn=torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            nccl=".".join(str(x) for x in torch.cuda.nccl.version()),  # type: ignore[no-untyped-call]
            gpu=props.name, capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(total / GIB, 1), gpu_free_gib=round(free / GIB, 1),
            bf16=torch.cuda.is_bf16_supported(),
        )  # fmt: skip
        out["triton_missing"] = missing
        if missing:
            out.update(ok=False, error=f"Triton cannot compile flex attention: no {missing}")
    else:
        out["triton_missing"] = missing  # unused on the CPU: the sections do not need it
    return out


def build_sections(ctx: Context, shapes: list[str]) -> list[Section]:
    """Every section in running order: names and the calls that run them."""
    out: list[Section] = []
    for shape in shapes:
        for impl in ("dense", ctx.tree_impl):
            out.append((f"train.{shape}.{impl}", partial(train_step, ctx, shape, impl)))
    first, last = shapes[0], shapes[-1]
    out.append((f"precision.{first}", partial(precision_agreement, ctx, first)))
    out.append((f"handover.{last}", partial(weight_handover, ctx, last)))
    out.append((f"tree_vs_linear.{first}", partial(tree_vs_linear, ctx, first)))
    out.append((f"streaming.{first}", partial(streaming_core, ctx, first)))
    return out


def selected(name: str, wanted: list[str] | None) -> bool:
    """``name`` is wanted when a filter entry is it or a dotted prefix of it."""
    return wanted is None or any(name == w or name.startswith(w + ".") for w in wanted)


class SectionTimeout(Exception):
    """A section ran past its time (raised from SIGALRM into the section's own code)."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise SectionTimeout("the section ran past its time limit")


def run_section(name: str, fn: Callable[[], dict[str, Any]], limit: float) -> dict[str, Any]:
    """Run one section: its figures with ``ok`` and ``seconds``, or its error."""
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(limit)))
    try:
        result = fn()
        line = {"section": name, "ok": True, **result}
    except BaseException as e:  # one section's failure, whatever it is, ends that section
        if isinstance(e, KeyboardInterrupt):
            raise
        tail = traceback.format_exc().strip().splitlines()[-16:]
        line = {"section": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": tail}  # fmt: skip
    finally:
        signal.alarm(0)
    line["seconds"] = round(time.perf_counter() - t0, 2)
    release_memory()
    return line


def release_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


def summary_table(lines: list[dict[str, Any]]) -> str:
    """A markdown table of the sections' main figures (what docs/benchmarks.md quotes)."""
    rows = ["| section | ok | s | figures |", "|---|---|---:|---|"]
    for ln in lines[1:]:
        figs = ", ".join(f"{k} {_fmt(ln[k])}" for k in SUMMARY_KEYS if ln.get(k) is not None)
        rows.append(f"| {ln['section']} | {'yes' if ln['ok'] else 'NO'} | {ln['seconds']} | {figs} |")  # fmt: skip
    env = lines[0]
    where = env.get("gpu") or f"CPU ({platform.processor() or platform.machine()})"
    return f"device: {where}, torch {env['torch']}\n\n" + "\n".join(rows)


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (for tests)")
    ap.add_argument("--device", help="cuda or cpu (default: cuda if present; quick: cpu)")
    ap.add_argument("--shapes", help="model shapes, comma-separated (0.6b,1.7b; quick: tiny)")
    ap.add_argument("--sections", help="comma-separated names or dotted prefixes (env always)")
    ap.add_argument("--vocab", type=int, help=f"vocabulary ({QWEN3_VOCAB}; quick: 512)")
    ap.add_argument("--groups", type=int, default=4, help="GRPO groups of the training batch")
    ap.add_argument("--steps", type=int, help="timed training steps (3; quick: 1)")
    ap.add_argument("--peak-tflops", type=float, help="bf16 dense peak (default: by GPU name)")
    ap.add_argument("--bucket-mb", type=float, help="hand-over bucket size (512; quick: 0.02)")
    ap.add_argument("--section-timeout", type=float, default=240.0, help="seconds a section")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all sections")
    ap.add_argument("--json-out", type=Path, help="also write the JSON lines to this file")
    args = ap.parse_args(argv)
    # What a flag leaves unset: the full check's value, or the quick one's.
    for name, full, quick in (("device", None, "cpu"), ("shapes", "0.6b,1.7b", "tiny"),
                              ("vocab", QWEN3_VOCAB, 512), ("steps", 3, 1),
                              ("bucket_mb", 512.0, 0.02)):  # fmt: skip
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
    ctx = Context(
        device=device, quick=args.quick, vocab=args.vocab, groups=args.groups,
        steps=args.steps, peak=peak_tflops(device, args.peak_tflops),
        bucket_bytes=int(args.bucket_mb * 1e6), timeout=min(args.section_timeout, 120.0),
    )  # fmt: skip
    wanted = args.sections.split(",") if args.sections else None
    start = time.perf_counter()
    sections: list[Section] = [("env", lambda: env_info(device))]
    sections += [s for s in build_sections(ctx, args.shapes.split(",")) if selected(s[0], wanted)]
    lines = []
    out = args.json_out.open("w") if args.json_out else None
    for name, fn in sections:
        left = args.budget - (time.perf_counter() - start)
        if left < 5:
            line = {"section": name, "ok": False, "seconds": 0.0,
                    "error": f"skipped: the run's budget of {args.budget:g} s is spent"}  # fmt: skip
        else:
            line = run_section(name, fn, min(args.section_timeout, left))
        lines.append(line)
        text = json.dumps(line, default=str)
        print(text, flush=True)
        if out:
            out.write(text + "\n")
            out.flush()
    if out:
        out.close()
    print(summary_table(lines), file=sys.stderr)
    return 0 if all(ln["ok"] for ln in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
