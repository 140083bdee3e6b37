"""benchmarks/gpu_weight_handover.py, the bucketed bf16 weight hand-over from the trainer
process to an engine process on one device: its quick mode on the CPU (a tiny shape in
several buckets arrives intact), a receiver that dies (the sender exits non-zero, no hang),
and the 1.7B shape where CUDA is present."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu_weight_handover.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if ok:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def test_the_quick_hand_over_runs_on_the_cpu_in_several_buckets_and_arrives_intact() -> None:
    text = _run("--quick").stdout
    assert "equal: yes" in text
    buckets = re.search(r"^(\d+) buckets of at most", text, re.M)
    assert buckets and int(buckets.group(1)) > 1, text
    median = re.search(r"cpu: median ([0-9.e+-]+) s \(([0-9.e+-]+) s/GB\)", text)
    assert median and float(median.group(1)) > 0 and float(median.group(2)) > 0, text
    assert len(re.findall(r"^hand-over \d+: ", text, re.M)) == 3
    assert "target <" not in text  # the GPU target is judged on CUDA only


def test_a_receiver_that_dies_makes_the_sender_fail_with_a_message() -> None:
    out = _run("--quick", "--fail-at", "1", "--timeout", "60", ok=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the receiver died (exit code 3)" in out.stderr
    assert "equal:" not in out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_1_7b_shape_is_handed_over_intact_on_the_gpu() -> None:
    text = _run("--shape", "1.7b").stdout
    assert "equal: yes" in text
    assert re.search(r"cuda: median [0-9.e+-]+ s", text) and "target < 2 s:" in text
