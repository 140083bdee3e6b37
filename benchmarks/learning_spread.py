"""How far learning curves part across draws: reads ``learning_bench.py --out`` files and
prints, at every version they all scored, each run's benchmark, the spread of each
policy's draws, how far each non-colocate run lies outside colocate's draws, and each
policy's mean curve over its draws against colocate's (a policy's expected curve, which a
single draw only estimates).

    python benchmarks/learning_spread.py s0=.data/bench/ss0.json s1=.data/bench/ss1.json \\
        s2=.data/bench/ss2.json [--tol 0.05]

Each argument is ``LABEL=FILE`` or ``LABEL=FILE:RUN[,RUN...]`` (only those runs of the file);
a run is named ``LABEL:name`` (``s1:colocate``), and one label may take runs from several
files (``s0=b1.json:colocate s0=s0e.json``: one draw whose runs were made apart). A
policy's *draws* are its runs across the files (``rollout.sample_seed`` differs between
them, docs/learning.md); give independent draws only, since a repeat of one
draw would weigh it twice in the means. Nothing is asserted; figures are the files'.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(specs: list[str]) -> dict[str, dict[int, float]]:
    runs: dict[str, dict[int, float]] = {}
    for spec in specs:
        label, eq, path = spec.partition("=")
        if not eq or not label:
            raise SystemExit(f"learning_spread: want LABEL=FILE, got {spec!r}")
        only: set[str] | None = None
        if not Path(path).exists() and ":" in path:
            path, _, picks = path.rpartition(":")
            only = {p for p in picks.split(",") if p}
        try:
            rows = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"learning_spread: {path}: {e}") from None
        if only is not None:
            missing = only - {row.get("name") for row in rows}
            if missing:
                raise SystemExit(
                    f"learning_spread: {path} has no run named {', '.join(sorted(missing))}"
                )
            rows = [row for row in rows if row.get("name") in only]
        for row in rows:
            curve = {int(v): float(b) for v, b in row.get("benchmark_curve", {}).items()}
            if not curve:
                continue
            key = f"{label}:{row['name']}"
            if key in runs:
                raise SystemExit(f"learning_spread: two runs named {key}; give each file its runs")
            runs[key] = curve
    if not runs:
        raise SystemExit("learning_spread: no run in these files has a benchmark curve")
    return runs


def policy(run: str) -> str:
    return run.split(":", 1)[1].split("@")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", metavar="LABEL=FILE")
    ap.add_argument("--tol", type=float, default=0.05)
    a = ap.parse_args()
    runs = load(a.files)
    versions = sorted(set.intersection(*(set(c) for c in runs.values())))
    names = sorted(runs, key=lambda r: (policy(r) != "colocate", r))
    groups: dict[str, list[str]] = {}
    for r in names:
        groups.setdefault(policy(r), []).append(r)
    print("| version | " + " | ".join(names) + " | "
          + " | ".join(f"{p} spread" for p in groups) + " |")  # fmt: skip
    print("|---:|" + "---:|" * (len(names) + len(groups)))
    for v in versions:
        cells = [f"{runs[r][v]:.3f}" for r in names]
        spreads = [max(runs[r][v] for r in g) - min(runs[r][v] for r in g) for g in groups.values()]
        print(f"| v{v} | " + " | ".join(cells) + " | "
              + " | ".join(f"{s:.3f}" for s in spreads) + " |")  # fmt: skip
    colo = groups.get("colocate", [])
    print()
    for p, g in groups.items():
        worst = max((max(runs[r][v] for r in g) - min(runs[r][v] for r in g), v) for v in versions)
        print(f"{p}: {len(g)} draw(s), largest spread {worst[0]:.3f} (v{worst[1]})")
    if not colo:
        return
    for r in names:
        if policy(r) == "colocate":
            continue
        same = f"{r.split(':')[0]}:colocate"  # colocate in the same file: the same draw
        gap = max((abs(runs[r][v] - runs[same][v]), v) for v in versions) if same in runs else None
        outside = []
        for v in versions:
            lo = min(runs[c][v] for c in colo) - a.tol
            hi = max(runs[c][v] for c in colo) + a.tol
            if not lo <= runs[r][v] <= hi:
                outside.append(f"v{v}")
        said = f"largest difference from {same} {gap[0]:.3f} (v{gap[1]}); " if gap else ""
        print(f"{r}: {said}outside colocate's draws by more than {a.tol}: "
              f"{len(outside)} of {len(versions)} versions {' '.join(outside)}")  # fmt: skip
    means = {p: {v: statistics.fmean(runs[r][v] for r in g) for v in versions}
             for p, g in groups.items()}  # fmt: skip
    others = [p for p in groups if p != "colocate"]
    gaps = {p: {v: means[p][v] - means["colocate"][v] for v in versions} for p in others}
    print("\n| version | " + " | ".join(f"{p} mean" for p in groups) + " | "
          + " | ".join(f"{p} - colocate" for p in others) + " |")  # fmt: skip
    print("|---:|" + "---:|" * (len(groups) + len(others)))
    for v in versions:
        print(f"| v{v} | " + " | ".join(f"{means[p][v]:.3f}" for p in groups) + " | "
              + " | ".join(f"{gaps[p][v]:+.3f}" for p in others) + " |")  # fmt: skip
    for p in others:
        beyond = [f"v{v}" for v in versions if abs(gaps[p][v]) > a.tol]
        worst = max((abs(d), v) for v, d in gaps[p].items())
        print(f"{p} mean of {len(groups[p])} vs colocate mean of {len(colo)}: largest "
              f"difference {worst[0]:.3f} (v{worst[1]}); more than {a.tol}: {len(beyond)} of "
              f"{len(versions)} versions {' '.join(beyond)}")  # fmt: skip


if __name__ == "__main__":
    main()
