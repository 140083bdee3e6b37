"""benchmarks/sim_timeline.py on a small cluster: one row a step, in publication order, and
the step-1 row waits for its batch (nothing was published before it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_timeline.py"), *args],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return out.stdout


def test_timeline_prints_each_step_and_what_it_waited_for() -> None:
    out = _run("--kind", "uniform", "--gpus", "32", "--rollouts-per-step", "16", "--steps", "6",
               "--policy", "async", "--split", "2:2", "--batch-order", "index")  # fmt: skip
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == [1, 2, 3, 4, 5, 6]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    published = [float(c[8].replace(",", "")) for c in cells]
    assert published == sorted(published) and published[0] > 0
    assert cells[0][9] == "its batch"
    for c in cells:  # a step never starts before its batch is done
        assert float(c[6].replace(",", "")) >= float(c[2].replace(",", ""))
    makespan = float(re.search(r"makespan ([\d,]+) s", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert abs(makespan - published[-1]) <= 1.0


def test_timeline_refuses_a_bad_split() -> None:
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_timeline.py"), "--gpus", "32",
         "--policy", "async", "--split", "3:3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "does not add up" in bad.stderr
