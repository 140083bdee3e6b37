"""benchmarks/gpu_check.py, the script a GPU machine without Ray runs: its quick mode on the
CPU (a tiny shape, fp32: the sharded one-process step agrees with the plain trainer), and
the whole check where CUDA is present."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def _agreement(text: str) -> float:
    m = re.search(r"relative difference ([0-9.e+-]+)", text)
    assert m, text
    return float(m.group(1))


def test_the_quick_check_runs_on_the_cpu_and_agrees_with_the_plain_trainer() -> None:
    text = _run("--quick")
    assert _agreement(text) < 1e-5
    assert re.search(r"tokens/s, MFU", text) and "tree-packed (sparse)" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_check_trains_a_qwen3_shape_in_bf16() -> None:
    text = _run("--shape", "0.6b", "--steps", "3")
    assert _agreement(text) < 2e-2  # bf16 on the GPU against fp32 on the CPU
    assert "tree-packed (flex)" in text
