"""Line-located JSONL input: the one error shape every Gyre file reader reports, and the
bounded JSON decoding every reader (files, the web API, the websocket) shares.

``loads`` refuses, with a one-line :class:`JsonBoundsError`, what ``json.loads`` would
crash on or let through unbounded: nesting deeper than ``MAX_DEPTH`` (``json.loads``
raises RecursionError near 1,000), an integer of more than Python's int-string limit
(4,300 digits; a ValueError without a position). ``NaN``, ``Infinity`` and a number such as
``1e400`` decode to non-finite floats, as Python's json does, so that each field's check
refuses them under its own name (``find_non_finite`` names the path in untyped data).
A string (value or key) holding a lone surrogate such as ``"\\ud800"`` is refused, naming
its key path: it is valid JSON but no UTF-8 text, so no database, file or socket can hold it.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_DEPTH = 64  # arrays/objects inside each other; Gyre's own formats need under 10
MAX_LINE_BYTES = 8 * 2**20  # one JSONL line (a rollout of ~1M tokens fits)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # JSON strings (may hold brackets)
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800-\udfff, paired or not
LONE_SURROGATE = "a lone surrogate (such as \\ud800) is not text"


class JsonBoundsError(ValueError):
    """Text that is not JSON, or JSON beyond the bounds above; ``problem`` is one line,
    ``line`` the text's line where JSON syntax broke (1 for the other problems), ``field``
    the key path of the refused value where one is to blame ("" otherwise)."""

    def __init__(self, problem: str, line: int = 1, field: str = "") -> None:
        super().__init__(problem)
        self.problem, self.line, self.field = problem, line, field


class LocatedError(ValueError):
    """Bad input, located: ``FILE:LINE: FIELD: problem``."""

    def __init__(self, file: str, line: int, field_name: str, problem: str) -> None:
        self.file, self.line, self.field, self.problem = file, line, field_name, problem
        super().__init__(f"{file}:{line}: {field_name}: {problem}")


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays/objects nest more than ``limit`` deep (brackets inside strings do not
    count). Linear, and stops at the first level too deep."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` within the bounds above; any failure is a JsonBoundsError."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonBoundsError(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if too_deep(text, max_depth):
        raise JsonBoundsError(f"nested more than {max_depth} levels deep")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonBoundsError(f"invalid JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise JsonBoundsError(f"nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # int-string limit: "Exceeds the limit (4300 digits) ..."
        if isinstance(exc, JsonBoundsError):
            raise
        limit = sys.get_int_max_str_digits()
        raise JsonBoundsError(f"an integer has more than {limit} digits") from None
    if _SURROGATE_ESCAPE.search(text):  # only an escape can make one; a pair is fine
        where = find_lone_surrogate(value)
        if where is not None:
            raise JsonBoundsError(LONE_SURROGATE, field=where)
    return value


def find_non_finite(value: Any, path: str = "") -> str | None:
    """The dotted path of the first non-finite number inside decoded JSON, or None."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return where or "<value>"
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def _not_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_lone_surrogate(value: Any, path: str = "") -> str | None:
    """The key path of the first string (a value, or a key: then the path ends at it) that
    holds a lone surrogate inside decoded JSON, or None."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if _not_text(v):
                return where or "<value>"
        elif isinstance(v, dict):
            for k, x in v.items():
                inner = f"{where}.{k}" if where else str(k)
                if _not_text(k):
                    return inner.encode("utf-8", "backslashreplace").decode()
                stack.append((inner, x))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def json_lines(
    path: str | Path, error: type[LocatedError], max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded object)`` for each non-blank line; a line that is not JSON,
    is over ``max_line_bytes`` or beyond ``loads``' bounds raises ``error`` naming it."""
    name = str(path)
    with open(path, "rb") as fh:  # bytes: a line that is not UTF-8 is located, not a crash
        lineno = 0
        while raw := fh.readline(max_line_bytes + 1):
            lineno += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise error(name, lineno, "<line>", f"longer than {max_line_bytes} bytes")
            if not raw.strip():
                continue
            try:
                obj = loads(raw)
            except JsonBoundsError as exc:
                raise error(name, lineno, exc.field or "<line>", exc.problem) from None
            yield lineno, obj
