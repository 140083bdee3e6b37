"""The docs and configs are a reference, not a lab notebook: no absolute path of a
development machine (``/work/...``, ``/root/...``, ``/home/<user>/...``, ``/tmp/...`` as a
place results were kept, ``C:\\...``) and no diary markers ("Session 12", "measurement 64").
Paths of the system that instructions need (``/usr/bin/chromium``, ``/etc/...``) are not
machine paths and are not matched; ALLOWED lists the few exceptions by file and text."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (what it is, pattern); each is searched on every line of every scanned file
RULES = (
    ("absolute machine path", re.compile(r"(?<![\w.~-])/(?:work|root|Users|mnt/data)/")),
    ("absolute machine path", re.compile(r"(?<![\w.~-])/home/[A-Za-z0-9_.-]+/")),
    ("absolute machine path", re.compile(r"(?<![\w.~-])/tmp/")),
    ("absolute machine path", re.compile(r"\b[A-Za-z]:\\\\?[A-Za-z]")),
    ("diary marker", re.compile(r"\b[Ss]ession \d+\b")),
    ("diary marker", re.compile(r"\b[Mm]easurements? \d+\b")),
)

# (file relative to the repository, text on the line) that may match a rule
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def scanned() -> list[Path]:
    files = [ROOT / "README.md"]
    where = (
        ("docs", "**/*.md"),
        ("deploy", "**/*.md"),
        ("configs", "**/*"),
        ("benchmarks", "**/*.md"),
    )
    for folder, pattern in where:
        files += sorted(p for p in (ROOT / folder).glob(pattern) if p.is_file())
    return files


def problems(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for what, rule in RULES:
                m = rule.search(line)
                if m and not any(rel == f and text in line for f, text in ALLOWED):
                    found.append(f"{rel}:{n}: {what} {m.group(0)!r}: {line.strip()[:120]}")
    return found


def test_docs_and_configs_name_no_machine_path_and_no_session() -> None:
    files = scanned()
    assert len(files) > 10 and any(p.name == "learning.md" for p in files)
    assert problems(files) == []


def test_the_scan_names_file_and_line(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text(
        "fine: /usr/bin/chromium, /etc/gyre/env, .data/bench/W.safetensors, ~/.cache/gyre\n"
        "## Session 13: a diary\n"
        "--set warm_start.weights=/work/main/.data/bench/W.safetensors\n"
        "kept in /tmp/vu/demo, and /home/alice/runs, C:\\Users\\x\n"
        "as measurement 64 showed\n"
    )
    found = problems([doc], tmp_path)
    assert [f.split(": ")[0] for f in found] == ["docs/x.md:2"] + ["docs/x.md:3"] + [
        "docs/x.md:4"
    ] * 3 + ["docs/x.md:5"]
    assert "'/work/'" in found[1] and "'/home/alice/'" in found[2] and "'/tmp/'" in found[3]
