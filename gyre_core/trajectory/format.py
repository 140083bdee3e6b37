"""The trajectory log format ``gyre.trajectory/v1``: one rollout per JSONL line.

The reader validates every field and reports bad input as one line
``FILE:LINE: FIELD: problem`` (a :class:`TrajectoryFormatError`), never a traceback.
Token ids, log-probabilities and versions are held as numpy arrays, so a long log
costs a few bytes per token rather than a Python object per token.

See ``docs/trajectory-format.md`` for the specification and an example.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre_core.jsonl import MAX_LINE_BYTES, LocatedError, json_lines

FORMAT = "gyre.trajectory/v1"
STATUSES = ("completed", "timeout", "failed")
# What failed in a rollout of status "failed" ("" = not recorded: read as the agent's).
# A timeout is its own status, not a failure: it keeps the credit of what it reached.
FAILURES = ("agent", "environment", "evaluation", "engine")
KINDS = ("continue", "compaction", "subagent", "retry", "branch")
MAX_TOKEN_ID = 2**31 - 1
# A log-probability is <= 0; engines sometimes report a hair above 0 from rounding.
LOGPROB_SLACK = 1e-3
# The longest id of each kind, in characters (the platform's columns hold exactly these).
MAX_ROLLOUT_ID = 100  # rollout_id and group_id
MAX_TASK_ID = 200
MAX_CALL_ID = 200  # call_id, agent and prefix.call_id
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # never inside an id (NUL cannot be stored)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class TrajectoryFormatError(LocatedError):
    """Bad input in a trajectory log, located: ``FILE:LINE: FIELD: problem``."""


@dataclass(frozen=True, slots=True)
class Prefix:
    """The call's full prompt starts with the first ``tokens`` tokens of ``call_id``'s
    full sequence (its full prompt followed by its completion)."""

    call_id: str
    tokens: int


@dataclass(slots=True)
class Call:
    call_id: str
    prompt_ids: IntArray
    completion_ids: IntArray
    logprobs: FloatArray
    versions: IntArray  # one per completion token
    agent: str = "main"
    kind: str = "continue"
    prefix: Prefix | None = None

    @property
    def prompt_len(self) -> int:
        """Length of the full prompt (the prefix tokens plus ``prompt_ids``)."""
        return (self.prefix.tokens if self.prefix else 0) + len(self.prompt_ids)

    @property
    def full_len(self) -> int:
        return self.prompt_len + len(self.completion_ids)


@dataclass(slots=True)
class Rollout:
    rollout_id: str
    task_id: str
    status: str
    progress: float
    calls: list[Call]
    group_id: str = ""
    reward: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    failure: str = ""  # status "failed" only: one of FAILURES ("" = unknown, the agent's)

    def __post_init__(self) -> None:
        if not self.group_id:
            self.group_id = self.rollout_id
        if self.reward is None:
            self.reward = self.progress

    @property
    def score(self) -> float:
        """The reward used for training (``reward``, which defaults to ``progress``)."""
        return float(self.reward if self.reward is not None else self.progress)


# --------------------------------------------------------------------------- reading


class _Checker:
    """Field validation for one line; every failure names the file, line and field."""

    def __init__(self, file: str, line: int) -> None:
        self.file, self.line = file, line

    def fail(self, name: str, problem: str) -> TrajectoryFormatError:
        return TrajectoryFormatError(self.file, self.line, name, problem)

    def get(self, obj: dict[str, Any], key: str, name: str, default: Any = ...) -> Any:
        if key in obj:
            return obj[key]
        if default is ...:
            raise self.fail(name, "missing required field")
        return default

    def string(self, value: Any, name: str, max_len: int = MAX_CALL_ID) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(name, f"expected a non-empty string, got {_show(value)}")
        if len(value) > max_len:
            raise self.fail(name, f"longer than {max_len} characters ({len(value)})")
        bad = _CONTROL.search(value)
        if bad:
            raise self.fail(name, f"contains the control character {bad.group()!r}")
        return value

    def number(self, value: Any, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(name, f"expected a number, got {_show(value)}")
        if not math.isfinite(value):
            raise self.fail(name, f"expected a finite number, got {value}")
        return float(value)

    def integer(self, value: Any, name: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"expected an integer, got {_show(value)}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        return value

    def int_array(self, value: Any, name: str) -> IntArray:
        if not isinstance(value, list):
            raise self.fail(name, f"expected a list of integers, got {_show(value)}")
        if not value:
            return np.zeros(0, dtype=np.int64)
        if any(type(v) is not int for v in value):
            bad = next(v for v in value if type(v) is not int)
            raise self.fail(name, f"expected a list of integers, found {_show(bad)}")
        try:
            arr = np.asarray(value, dtype=np.int64)
        except OverflowError:
            raise self.fail(name, "token id out of range") from None
        if arr.min() < 0:
            raise self.fail(name, f"negative token id {int(arr.min())}")
        if arr.max() > MAX_TOKEN_ID:
            raise self.fail(name, f"token id {int(arr.max())} exceeds {MAX_TOKEN_ID}")
        return arr

    def float_array(self, value: Any, name: str, length: int) -> FloatArray:
        if not isinstance(value, list):
            raise self.fail(name, f"expected a list of numbers, got {_show(value)}")
        if len(value) != length:
            raise self.fail(
                name, f"has {len(value)} entries, expected {length} (one per completion token)"
            )
        if not value:
            return np.zeros(0, dtype=np.float64)
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in value):
            bad = next(v for v in value if isinstance(v, bool) or not isinstance(v, int | float))
            raise self.fail(name, f"expected a list of numbers, found {_show(bad)}")
        arr = np.asarray(value, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise self.fail(name, "log-probabilities must be finite")
        if arr.max() > LOGPROB_SLACK:
            raise self.fail(name, f"a log-probability must be <= 0, got {arr.max():.6g}")
        return arr


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float | int) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_rollout(obj: Any, file: str = "<input>", line: int = 1) -> Rollout:
    """Validate one decoded JSON object and return the :class:`Rollout` it describes."""
    ck = _Checker(file, line)
    if not isinstance(obj, dict):
        raise ck.fail("<line>", f"expected a JSON object, got {_show(obj)}")
    fmt = ck.get(obj, "format", "format")
    if fmt != FORMAT:
        raise ck.fail("format", f"expected {FORMAT!r}, got {_show(fmt)}")
    rollout_id = ck.string(ck.get(obj, "rollout_id", "rollout_id"), "rollout_id", MAX_ROLLOUT_ID)
    task_id = ck.string(ck.get(obj, "task_id", "task_id"), "task_id", MAX_TASK_ID)
    group_id = ck.string(
        ck.get(obj, "group_id", "group_id", rollout_id), "group_id", MAX_ROLLOUT_ID
    )
    status = ck.get(obj, "status", "status")
    if status not in STATUSES:
        raise ck.fail("status", f"expected one of {', '.join(STATUSES)}, got {_show(status)}")
    progress = ck.number(ck.get(obj, "progress", "progress"), "progress")
    if not 0.0 <= progress <= 1.0:
        raise ck.fail("progress", f"must be in [0, 1], got {progress}")
    reward = ck.number(ck.get(obj, "reward", "reward", progress), "reward")
    failure = ck.get(obj, "failure", "failure", "")
    if failure and status != "failed":
        raise ck.fail("failure", f"set on a rollout of status {status!r} (only 'failed' has one)")
    if failure not in ("", *FAILURES):
        raise ck.fail("failure", f"expected one of {', '.join(FAILURES)}, got {_show(failure)}")
    raw_calls = ck.get(obj, "calls", "calls")
    if not isinstance(raw_calls, list):
        raise ck.fail("calls", f"expected a list of calls, got {_show(raw_calls)}")
    calls: list[Call] = []
    full_lens: dict[str, int] = {}
    for i, raw in enumerate(raw_calls):
        call = _parse_call(ck, raw, f"calls[{i}]", full_lens)
        full_lens[call.call_id] = call.full_len
        calls.append(call)
    known = {"format", "rollout_id", "task_id", "group_id", "status", "progress", "reward", "calls"}
    extra = {k: v for k, v in obj.items() if k not in known | {"failure"}}
    return Rollout(rollout_id, task_id, status, progress, calls, group_id, reward, extra, failure)


def _parse_call(ck: _Checker, raw: Any, where: str, full_lens: dict[str, int]) -> Call:
    if not isinstance(raw, dict):
        raise ck.fail(where, f"expected a JSON object, got {_show(raw)}")
    call_id = ck.string(ck.get(raw, "call_id", f"{where}.call_id"), f"{where}.call_id")
    if call_id in full_lens:
        raise ck.fail(f"{where}.call_id", f"duplicate call id {call_id!r} in this rollout")
    agent = ck.string(ck.get(raw, "agent", f"{where}.agent", "main"), f"{where}.agent")
    kind = ck.get(raw, "kind", f"{where}.kind", "continue")
    if kind not in KINDS:
        raise ck.fail(f"{where}.kind", f"expected one of {', '.join(KINDS)}, got {_show(kind)}")
    prefix = None
    raw_prefix = raw.get("prefix")
    if raw_prefix is not None:
        if not isinstance(raw_prefix, dict):
            raise ck.fail(f"{where}.prefix", f"expected an object, got {_show(raw_prefix)}")
        ref = ck.string(
            ck.get(raw_prefix, "call_id", f"{where}.prefix.call_id"), f"{where}.prefix.call_id"
        )
        if ref not in full_lens:
            raise ck.fail(
                f"{where}.prefix.call_id", f"names no earlier call of this rollout: {ref!r}"
            )
        n = ck.integer(
            ck.get(raw_prefix, "tokens", f"{where}.prefix.tokens"), f"{where}.prefix.tokens"
        )
        if n > full_lens[ref]:
            raise ck.fail(
                f"{where}.prefix.tokens", f"{n} exceeds the {full_lens[ref]} tokens of call {ref!r}"
            )
        prefix = Prefix(ref, n)
    prompt = ck.int_array(ck.get(raw, "prompt_ids", f"{where}.prompt_ids"), f"{where}.prompt_ids")
    completion = ck.int_array(
        ck.get(raw, "completion_ids", f"{where}.completion_ids"), f"{where}.completion_ids"
    )
    if (prefix.tokens if prefix else 0) + len(prompt) == 0:
        raise ck.fail(
            f"{where}.prompt_ids", "the full prompt is empty (a completion needs context)"
        )
    logprobs = ck.float_array(
        ck.get(raw, "logprobs", f"{where}.logprobs"), f"{where}.logprobs", len(completion)
    )
    raw_versions = ck.get(raw, "versions", f"{where}.versions")
    if isinstance(raw_versions, list):
        versions = ck.int_array(raw_versions, f"{where}.versions")
        if len(versions) != len(completion):
            raise ck.fail(
                f"{where}.versions",
                f"has {len(versions)} entries, expected {len(completion)} (one per completion token)",
            )
    else:
        v = ck.integer(raw_versions, f"{where}.versions")
        versions = np.full(len(completion), v, dtype=np.int64)
    return Call(call_id, prompt, completion, logprobs, versions, agent, kind, prefix)


def read_rollouts(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Rollout]:
    """Stream and validate the rollouts of a ``gyre.trajectory/v1`` file (a line longer
    than ``max_line_bytes`` is refused)."""
    name = str(path)
    seen: set[str] = set()
    for lineno, obj in json_lines(path, TrajectoryFormatError, max_line_bytes):
        rollout = parse_rollout(obj, name, lineno)
        if rollout.rollout_id in seen:
            raise TrajectoryFormatError(
                name, lineno, "rollout_id", f"duplicate rollout id {rollout.rollout_id!r}"
            )
        seen.add(rollout.rollout_id)
        yield rollout


def full_sequences(rollout: Rollout) -> dict[str, IntArray]:
    """Each call's full sequence (full prompt, then completion) with prefixes resolved.

    Materialises every context: for tests and small logs; the tree builder never does."""
    out: dict[str, IntArray] = {}
    for c in rollout.calls:
        head = out[c.prefix.call_id][: c.prefix.tokens] if c.prefix else np.zeros(0, np.int64)
        out[c.call_id] = np.concatenate([head, c.prompt_ids, c.completion_ids])
    return out
