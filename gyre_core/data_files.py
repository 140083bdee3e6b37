"""What a data file must be to be kept as a dataset of its kind (the platform's uploads),
read as that kind's readers read it, before any run does.

- ``tasks``: JSONL, one JSON object a line (``rollout.tasks``), or a Parquet file (its
  first bytes say so, never the client's file name) whose rows are read batch by batch;
- ``trajectories``: JSONL, either ``gyre.trajectory/v1`` (every line valid for
  ``gyre_core.trajectory.format.parse_rollout``, rollout ids unique) or an OpenAI message
  log (``warm_start.data``: ``messages``, ``tools``, ``id``, ``reward``, an assistant
  message's ``token_ids``/``logprobs``), checked without a tokenizer.

Every string (keys included) is free of NUL and lone surrogates (Postgres text holds
neither) and every number finite. A refusal is a :class:`DataFileError` whose message
gives the line (or Parquet row) and the field inside it, never the file's path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gyre_core.jsonl import LocatedError, find_non_finite, json_lines
from gyre_core.rollout.chat import ChatError, check_messages, check_tools
from gyre_core.trajectory.format import FORMAT, TrajectoryFormatError, parse_rollout

PARQUET_MAGIC = b"PAR1"
_BAD_TEXT = re.compile(r"[\x00\ud800-\udfff]")


class DataFileError(ValueError):
    """The file (or its kind) cannot be kept; ``field`` is ``file`` or ``kind``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


class _LineError(LocatedError):
    pass


def _located(where: str, field: str, problem: str) -> DataFileError:
    return DataFileError("file", f"{where}: {field}: {problem}")


def bad_text(value: Any, path: str = "") -> str | None:
    """The path of the first string (or key) holding NUL or a lone surrogate, or None."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if _BAD_TEXT.search(v):
                return where or "<value>"
        elif isinstance(v, dict):
            for k, x in v.items():
                name = f"{where}.{k}" if where else str(k)
                if isinstance(k, str) and _BAD_TEXT.search(k):
                    return _BAD_TEXT.sub("?", name)
                stack.append((name, x))
        elif isinstance(v, list | tuple):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def _check_values(obj: Any, where: str) -> None:
    text = bad_text(obj)
    if text is not None:
        raise _located(where, text, "holds NUL or a lone surrogate (not storable text)")
    number = find_non_finite(obj)
    if number is not None:
        raise _located(where, number, "expected a finite number")


def _lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    try:
        yield from json_lines(path, _LineError, max_line_bytes)
    except _LineError as e:
        raise _located(f"line {e.line}", e.field, e.problem) from None


KINDS = ("tasks", "trajectories")


def inspect(path: Path, kind: str, max_line_bytes: int) -> tuple[str, int]:
    """Check the file at ``path`` as a dataset of ``kind``; -> (format, rows): format is
    ``jsonl`` or ``parquet`` (tasks), ``trajectory`` or ``chat_log`` (trajectories)."""
    if kind not in KINDS:
        raise DataFileError("kind", f"expected one of {', '.join(KINDS)}")
    with open(path, "rb") as fh:
        parquet = fh.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    if kind == "tasks":
        rows = _parquet_tasks(path) if parquet else _jsonl_tasks(path, max_line_bytes)
        if not rows:
            raise DataFileError("file", "the file holds no task")
        return ("parquet" if parquet else "jsonl"), rows
    if parquet:
        raise DataFileError(
            "file", "a trajectories dataset is JSONL (gyre.trajectory/v1 or a message log)"
        )
    fmt, rows = _trajectories(path, max_line_bytes)
    if not rows:
        raise DataFileError("file", "the file holds no rollout or conversation")
    return fmt, rows


def _jsonl_tasks(path: Path, max_line_bytes: int) -> int:
    rows = 0
    for lineno, obj in _lines(path, max_line_bytes):
        if not isinstance(obj, dict):
            raise _located(f"line {lineno}", "<line>", "expected a JSON object (one task)")
        _check_values(obj, f"line {lineno}")
        rows += 1
    return rows


def _parquet_tasks(path: Path) -> int:
    import pyarrow.parquet as pq

    rows = 0
    try:
        with open(path, "rb") as fh:  # a file object: pyarrow's errors then name no path
            for batch in pq.ParquetFile(fh).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    rows += 1
                    _check_values(row, f"row {rows}")
    except DataFileError:
        raise
    except Exception as e:  # pyarrow's errors have no common base
        text = str(e).replace(str(path), "<file>")
        problem = text.splitlines()[0][:200] if text else type(e).__name__
        raise DataFileError("file", f"not a readable Parquet file ({problem})") from None
    return rows


def _trajectories(path: Path, max_line_bytes: int) -> tuple[str, int]:
    fmt, rows, seen = "", 0, set()
    for lineno, obj in _lines(path, max_line_bytes):
        where = f"line {lineno}"
        if not fmt:
            chat = isinstance(obj, dict) and obj.get("format") != FORMAT and "messages" in obj
            fmt = "chat_log" if chat else "trajectory"
        _check_values(obj, where)
        if fmt == "trajectory":
            try:
                rid = parse_rollout(obj, "file", lineno).rollout_id
            except TrajectoryFormatError as e:
                problem = e.problem
                if not rows and e.field == "format":
                    problem += f" (a {FORMAT} line, or a message log's line with 'messages')"
                raise _located(where, e.field, problem) from None
        else:
            rid = _conversation(obj, where, lineno)
        if rid in seen:
            raise _located(where, "rollout_id" if fmt == "trajectory" else "id", "duplicate id")
        seen.add(rid)
        rows += 1
    return fmt or "trajectory", rows


def _conversation(obj: Any, where: str, lineno: int) -> str:
    """One message-log line, as ``gyre_core.rollout.chat_log`` reads it, short of the
    tokenizer (the run renders it in its model's chat format); -> its id."""
    if not isinstance(obj, dict):
        raise _located(where, "<line>", "expected a JSON object")
    rid = obj.get("id", f"line-{lineno}")
    if not isinstance(rid, str) or not rid:
        raise _located(where, "id", "expected a non-empty string")
    reward = obj.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise _located(where, "reward", "expected a number")
    group = obj.get("group", "g")
    if not isinstance(group, str) or not group:
        raise _located(where, "group", "expected a non-empty string")
    try:
        messages = check_messages(obj.get("messages"))
        check_tools(obj.get("tools"))
    except ChatError as e:
        raise _located(where, e.param, e.problem) from None
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if not assistants:
        raise _located(where, "messages", "no assistant message: nothing to train")
    if assistants[0] == 0:
        raise _located(where, "messages[0]", "an assistant message needs the messages it answers")
    for i in assistants:
        _generated(obj["messages"][i], f"messages[{i}]", where)
    return rid


def _generated(raw: dict[str, Any], at: str, where: str) -> None:
    ids = raw.get("token_ids")
    if ids is None:
        return
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
    ):
        raise _located(where, f"{at}.token_ids", "expected a non-empty list of token ids")
    lp = raw.get("logprobs")
    if lp is not None and (
        not isinstance(lp, list)
        or len(lp) != len(ids)
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and x <= 1e-3 for x in lp)
    ):
        raise _located(where, f"{at}.logprobs", f"expected {len(ids)} log-probabilities (<= 0)")
