"""benchmarks/learning_spread.py: the spread of each policy's draws, and the versions where
a run lies outside colocate's draws by more than the tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_spread.py"


def _file(path: Path, curves: dict[str, dict[int, float]]) -> str:
    rows = [{"name": n, "benchmark_curve": {str(v): b for v, b in c.items()}}
            for n, c in curves.items()]  # fmt: skip
    path.write_text(json.dumps(rows))
    return str(path)


def test_spread_and_envelope(tmp_path: Path) -> None:
    a = _file(tmp_path / "a.json", {"colocate": {0: 0.0, 2: 0.1, 4: 0.5},
                                    "elastic": {0: 0.0, 2: 0.3, 4: 0.52, 6: 0.9}})  # fmt: skip
    b = _file(tmp_path / "b.json", {"colocate": {0: 0.0, 2: 0.2, 4: 0.4}})
    out = subprocess.run([sys.executable, str(SCRIPT), f"a={a}", f"b={b}"], capture_output=True,
                         text=True, check=True, timeout=60).stdout  # fmt: skip
    assert "| v2 | 0.100 | 0.200 | 0.300 | 0.100 | 0.000 |" in out
    assert "v6" not in out.split("\n\n")[0]  # only versions every run scored
    assert "colocate: 2 draw(s), largest spread 0.100 (v2)" in out
    # 0.3 is 0.1 above colocate's highest draw at v2; 0.52 is within 0.05 of 0.5 at v4
    assert "a:elastic: largest difference from a:colocate 0.200 (v2)" in out
    assert "more than 0.05: 1 of 3 versions v2" in out
    # means: colocate 0.15 at v2 (0.1 and 0.2), 0.45 at v4; elastic's one draw 0.3 and 0.52
    assert "| v2 | 0.150 | 0.300 | +0.150 |" in out and "| v4 | 0.450 | 0.520 | +0.070 |" in out
    assert (
        "elastic mean of 1 vs colocate mean of 2: largest difference 0.150 (v2); "
        "more than 0.05: 2 of 3 versions v2 v4" in out
    )


def test_bad_argument_is_named(tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, str(SCRIPT), "no-equals-sign"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "LABEL=FILE" in bad.stderr


def test_one_draw_from_two_files(tmp_path: Path) -> None:
    # colocate of draw s0 from one file, elastic of the same draw from another; the first
    # file's elastic (another setting) is left out
    a = _file(tmp_path / "a.json", {"colocate": {0: 0.0, 4: 0.5}, "elastic": {0: 0.0, 4: 0.1}})
    b = _file(tmp_path / "b.json", {"elastic": {0: 0.0, 4: 0.45}})
    out = subprocess.run([sys.executable, str(SCRIPT), f"s0={a}:colocate", f"s0={b}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout  # fmt: skip
    assert "s0:elastic: largest difference from s0:colocate 0.050 (v4)" in out
    assert "elastic: 1 draw(s)" in out and "0.100" not in out
    both = subprocess.run([sys.executable, str(SCRIPT), f"s0={a}", f"s0={b}"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert both.returncode != 0 and "two runs named s0:elastic" in both.stderr
    gone = subprocess.run([sys.executable, str(SCRIPT), f"s0={a}:async"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert gone.returncode != 0 and "no run named async" in gone.stderr
