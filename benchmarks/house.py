"""The house as its imports draw it: package circles, floors, arrows back up, long code.

    python benchmarks/house.py            # the report
    python benchmarks/house.py --json     # the same, as JSON

Read from every module's source (its AST), like ``tests/test_boundaries.py``: imports
nothing it measures. An import inside a function or under ``TYPE_CHECKING`` counts like any
other (a lazy import hides a circle from the interpreter, not from a reader).

- A *package* of gyre_core is one of its folders or top-level modules (``rollout``,
  ``config``); an arrow ``a -> b`` means a module of ``a`` imports a module of ``b``.
- A *circle* is a strongly connected set of two or more packages.
- *Floors*: the packages ordered so that as few arrows as possible point up (exact within
  each circle), each package one floor above the highest it imports; an *arrow back up*
  is one that points to its own floor or higher. No circle, no arrow back up.
- ``platform -> workers``: a platform module importing the workers' package.
- Long files (over 500 lines) and long functions (over 60, and over 80, lines, from
  ``def`` to its last line) of gyre_core, ``platform/gyre_web`` and ``workers``.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gyre_core", "platform/gyre_web", "workers")
LONG_FILE, LONG_FUNCTION, TOO_LONG_FUNCTION = 500, 60, 80


def sources(root: Path, folder: str) -> Iterator[tuple[str, str, Path]]:
    """(path relative to ``root``, module name, file) for each module under ``folder``."""
    base = root / "platform" if folder.startswith("platform/") else root
    for path in sorted((root / folder).rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield path.relative_to(root).as_posix(), ".".join(parts), path


def imports(path: Path, module: str, known: frozenset[str]) -> Iterator[tuple[int, str]]:
    """(line, imported module) for each import in ``path``; ``from a import b`` gives ``a.b``
    when that names a module of the repository, else ``a``; relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield node.lineno, full if full in known else base


def package_of(module: str) -> str | None:
    """gyre_core's package a module belongs to (``gyre_core.rollout.chat`` -> ``rollout``)."""
    parts = module.split(".")
    if parts[0] != "gyre_core" or len(parts) < 2:
        return None
    return parts[1]


@dataclass
class House:
    # (from package, to package) -> the imports that draw the arrow, "file:line imports m"
    arrows: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    packages: set[str] = field(default_factory=set)
    platform_to_workers: list[str] = field(default_factory=list)
    long_files: list[tuple[str, int]] = field(default_factory=list)
    long_functions: list[tuple[str, int]] = field(default_factory=list)

    def circles(self) -> list[list[str]]:
        """Each set of two or more packages that reach one another, sorted."""
        return [sorted(c) for c in _strong_components(self.packages, self.arrows) if len(c) > 1]

    def floors(self) -> tuple[dict[str, int], list[tuple[str, str]]]:
        """Each package's floor (0: imports no other package) and the arrows back up."""
        order: list[str] = []  # bottom first
        for component in reversed(_strong_components(self.packages, self.arrows)):
            order += _fewest_up(component, self.arrows)
        rank = {p: i for i, p in enumerate(order)}
        up = sorted((a, b) for a, b in self.arrows if rank[b] >= rank[a])
        floor: dict[str, int] = {}
        for p in order:
            below = [floor[b] for a, b in self.arrows if a == p and rank[b] < rank[p]]
            floor[p] = 1 + max(below) if below else 0
        return floor, up

    def report(self) -> dict[str, object]:
        floor, up = self.floors()
        long_fn = [f for f in self.long_functions if f[1] > LONG_FUNCTION]
        return {
            "packages": len(self.packages),
            "circles": self.circles(),
            "two_way_ties": sorted(
                f"{a}<->{b}"
                for a, b in combinations(sorted(self.packages), 2)
                if (a, b) in self.arrows and (b, a) in self.arrows
            ),
            "floors": 1 + max(floor.values(), default=-1),
            "floor_of": {p: floor[p] for p in sorted(floor, key=lambda p: (floor[p], p))},
            "arrows_back_up": [{"arrow": f"{a} -> {b}", "by": self.arrows[(a, b)]} for a, b in up],
            "platform_to_workers": self.platform_to_workers,
            f"files_over_{LONG_FILE}": [f"{p} ({n})" for p, n in self.long_files],
            f"functions_over_{LONG_FUNCTION}": [f"{p} ({n})" for p, n in long_fn],
            f"functions_over_{TOO_LONG_FUNCTION}": [
                f"{p} ({n})" for p, n in long_fn if n > TOO_LONG_FUNCTION
            ],
        }


def survey(root: Path = ROOT) -> House:
    house = House()
    known = frozenset(m for f in FOLDERS for _, m, _ in sources(root, f))
    for folder in FOLDERS:
        for rel, module, path in sources(root, folder):
            mine = package_of(module)
            if mine:
                house.packages.add(mine)
            for line, name in imports(path, module, known):
                theirs = package_of(name)
                if mine and theirs and theirs != mine:
                    by = house.arrows.setdefault((mine, theirs), [])
                    if (seen := f"{rel}:{line} imports {name}") not in by:
                        by.append(seen)
                if folder.startswith("platform/") and name.split(".")[0] == "workers":
                    house.platform_to_workers.append(f"{rel}:{line} imports {name}")
            text = path.read_text()
            lines = text.count("\n") + (not text.endswith("\n") and bool(text))
            if lines > LONG_FILE:
                house.long_files.append((rel, lines))
            for node in ast.walk(ast.parse(text, str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > LONG_FUNCTION:
                        house.long_functions.append((f"{rel}:{node.lineno} {node.name}", n))
    return house


def _strong_components(
    nodes: set[str], arrows: dict[tuple[str, str], list[str]]
) -> list[list[str]]:
    """Tarjan's strongly connected components, each listed before those it imports."""
    out_of: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(arrows):
        out_of[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in out_of[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return list(reversed(found))  # Tarjan finds the imported first


def _fewest_up(component: list[str], arrows: dict[tuple[str, str], list[str]]) -> list[str]:
    """The component's packages bottom first, with the fewest arrows pointing up (exact:
    a dynamic programme over subsets; the components here have a handful of packages)."""
    if len(component) == 1:
        return component
    n = len(component)
    inside = [(component.index(a), component.index(b)) for a, b in arrows if
              a in component and b in component]  # fmt: skip
    best: dict[int, tuple[int, list[int]]] = {0: (0, [])}
    for mask in range(1 << n):
        if mask not in best:
            continue
        cost, order = best[mask]
        for v in range(n):
            if mask & (1 << v):
                continue
            # v goes on the next floor up: its arrows into packages not yet placed point up
            extra = sum(1 for a, b in inside if a == v and not mask & (1 << b))
            nxt = mask | (1 << v)
            if nxt not in best or cost + extra < best[nxt][0]:
                best[nxt] = (cost + extra, [*order, v])
    return [component[i] for i in best[(1 << n) - 1][1]]


def render(report: dict[str, object]) -> str:
    lines = []
    for key, value in report.items():
        if isinstance(value, list):
            lines.append(f"{key}: {len(value)}")
            for item in value:
                if isinstance(item, dict):
                    lines.append(f"  {item['arrow']}")
                    lines += [f"      {by}" for by in item["by"][:4]]
                    if len(item["by"]) > 4:
                        lines.append(f"      ... {len(item['by']) - 4} more")
                else:
                    lines.append(f"  {item}")
        elif isinstance(value, dict):
            lines.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in value.items()))
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


if __name__ == "__main__":
    report = survey().report()
    print(json.dumps(report, indent=2) if "--json" in sys.argv else render(report))
