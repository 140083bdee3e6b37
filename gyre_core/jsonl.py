"""Line-located JSONL input: the one error shape every Gyre file reader reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class LocatedError(ValueError):
    """Bad input, located: ``FILE:LINE: FIELD: problem``."""

    def __init__(self, file: str, line: int, field_name: str, problem: str) -> None:
        self.file, self.line, self.field, self.problem = file, line, field_name, problem
        super().__init__(f"{file}:{line}: {field_name}: {problem}")


def json_lines(path: str | Path, error: type[LocatedError]) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded object)`` for each non-blank line; invalid JSON raises
    ``error`` naming the line."""
    name = str(path)
    with open(path, "rb") as fh:  # bytes: a line that is not UTF-8 is located, not a crash
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(name, lineno, "<line>", f"not UTF-8 text: {exc.reason} "
                            f"at byte {exc.start}") from None  # fmt: skip
            if not text.strip():
                continue
            try:
                yield lineno, json.loads(text)
            except json.JSONDecodeError as exc:
                raise error(name, lineno, "<line>", f"invalid JSON: {exc.msg}") from None
