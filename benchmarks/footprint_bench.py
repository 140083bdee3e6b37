"""Peak memory of a whole CPU run: the driver, Ray's own processes, the unit actors (engines
and training replicas) — everything descended from one ``gyre run``.

Samples every process in the tree every ``--every`` seconds from ``/proc``: the sum of
their PSS (proportional set size: a page shared by k processes counts 1/k in each, so
torch's shared libraries are not counted once per actor) and, for comparison, the sum of
their RSS (which counts shared pages once per process and so overstates). Prints the
peaks, the process count at the peak, the run's wall time and its summary line.

    .venv/bin/python benchmarks/footprint_bench.py configs/demo-elastic.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in kB; (0, 0) once it is gone."""
    try:
        pss = rss = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
        return pss, rss
    except (OSError, ValueError):
        return 0, 0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", nargs="?", default=str(ROOT / "configs" / "demo-elastic.yaml"))
    p.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    p.add_argument("--quick", action="store_true", help="a smoke run: the config at 2 steps")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gyre-footprint-") as work:
        if a.quick:  # the same config, fewer steps
            data = yaml.safe_load(Path(a.config).read_text())
            data["steps"] = 2
            a.config = str(Path(work) / "quick.yaml")
            Path(a.config).write_text(yaml.safe_dump(data))
        cmd = [sys.executable, "-m", "gyre_core.cli.main", "run", a.config, "--json",
               "--workdir", work]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)  # fmt: skip
        peak_pss = peak_rss = peak_n = 0
        while proc.poll() is None:
            pids = tree(proc.pid)
            sizes = [memory_kb(pid) for pid in pids]
            pss, rss = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
            if pss > peak_pss:
                peak_pss, peak_n = pss, len(pids)
            peak_rss = max(peak_rss, rss)
            time.sleep(a.every)
        wall = time.perf_counter() - t0
        out = proc.stdout.read() if proc.stdout else ""
    summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    print(f"config: {a.config}")
    print(f"exit code {proc.returncode}, wall {wall:.1f} s, load average "
          f"{Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
    print(f"peak PSS of the process tree: {peak_pss / 1024:,.0f} MB "
          f"({peak_n} processes at that moment)")  # fmt: skip
    print(f"peak RSS sum (counts shared pages once per process): {peak_rss / 1024:,.0f} MB")
    keys = ("policy", "steps", "wall_s", "role_switches", "calls_migrated", "sessions_restarted")
    print("summary:", {k: summary.get(k) for k in keys})
    if proc.returncode != 0:
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
