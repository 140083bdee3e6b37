"""gyre.trajectory/v1: validation messages, defaults and round trips."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from gyre_core.trajectory.format import (
    FORMAT,
    Call,
    Rollout,
    TrajectoryFormatError,
    read_rollouts,
)
from gyre_core.trajectory.writer import rollout_to_json, write_rollouts
from tests.trajectory.naive import full_sequences
from tests.trajectory.strategies import logs

GOOD: dict[str, Any] = {
    "format": FORMAT,
    "rollout_id": "r-1",
    "task_id": "t-1",
    "status": "timeout",
    "progress": 0.75,
    "calls": [
        {
            "call_id": "c1",
            "prompt_ids": [1, 2, 3],
            "completion_ids": [4, 5],
            "logprobs": [-0.1, -0.2],
            "versions": 3,
        },
        {
            "call_id": "c2",
            "kind": "compaction",
            "prefix": {"call_id": "c1", "tokens": 2},
            "prompt_ids": [9],
            "completion_ids": [7],
            "logprobs": [-1.0],
            "versions": [4],
        },
    ],
}


def write_lines(tmp_path: Path, *objs: Any) -> Path:
    p = tmp_path / "log.jsonl"
    p.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return p


def test_defaults_and_prefix(tmp_path):
    (r,) = read_rollouts(write_lines(tmp_path, GOOD))
    assert r.group_id == "r-1" and r.reward == 0.75 and r.score == 0.75
    c1, c2 = r.calls
    assert (c1.agent, c1.kind, c1.versions.tolist()) == ("main", "continue", [3, 3])
    assert c2.prefix is not None and c2.prompt_len == 3 and c2.full_len == 4
    assert full_sequences(r) == [[1, 2, 3, 4, 5], [1, 2, 9, 7]]


def mutate(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(GOOD)
    *head, last = path.split(".")
    target: Any = obj
    for part in head:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return obj


BAD = [
    ("format", "other/v0", "format", "expected 'gyre.trajectory/v1'"),
    ("rollout_id", KeyError, "rollout_id", "missing required field"),
    ("task_id", 7, "task_id", "expected a non-empty string"),
    ("status", "done", "status", "expected one of completed, timeout, failed"),
    ("progress", 1.5, "progress", "must be in [0, 1]"),
    ("progress", True, "progress", "expected a number"),
    ("calls", {}, "calls", "expected a list"),
    ("calls.0.prompt_ids", [1, -2], "calls[0].prompt_ids", "negative token id -2"),
    ("calls.0.prompt_ids", [1, 2.5], "calls[0].prompt_ids", "expected a list of integers"),
    ("calls.0.logprobs", [-0.1], "calls[0].logprobs", "has 1 entries, expected 2"),
    ("calls.0.logprobs", [-0.1, 0.5], "calls[0].logprobs", "must be <= 0"),
    ("calls.0.versions", [1, 2, 3], "calls[0].versions", "has 3 entries, expected 2"),
    ("calls.0.versions", -1, "calls[0].versions", "must be >= 0"),
    ("calls.0.kind", "fork", "calls[0].kind", "expected one of"),
    ("calls.1.call_id", "c1", "calls[1].call_id", "duplicate call id 'c1'"),
    ("calls.1.prefix.call_id", "c9", "calls[1].prefix.call_id", "names no earlier call"),
    ("calls.1.prefix.tokens", 6, "calls[1].prefix.tokens", "6 exceeds the 5 tokens of call 'c1'"),
    ("calls.0.prompt_ids", [], "calls[0].prompt_ids", "the full prompt is empty"),
    ("calls.0.completion_ids", KeyError, "calls[0].completion_ids", "missing required field"),
    ("failure", "engine", "failure", "set on a rollout of status 'timeout'"),
]


def test_failure_is_read_written_and_optional(tmp_path):
    """A failed rollout says what failed; a log without the field still reads ("")."""
    failed = GOOD | {"rollout_id": "f", "status": "failed", "failure": "environment"}
    old = GOOD | {"rollout_id": "o", "status": "failed"}
    bad = GOOD | {"rollout_id": "b", "status": "failed", "failure": "disk"}
    a, b = read_rollouts(write_lines(tmp_path, failed, old))
    assert (a.failure, b.failure) == ("environment", "")
    assert "failure" not in a.extra and rollout_to_json(a)["failure"] == "environment"
    assert "failure" not in rollout_to_json(b)
    with pytest.raises(TrajectoryFormatError, match="failure: expected one of agent, environment"):
        list(read_rollouts(write_lines(tmp_path, bad)))


@pytest.mark.parametrize(("path", "value", "field", "problem"), BAD)
def test_bad_input_is_one_located_line(tmp_path, path, value, field, problem):
    p = write_lines(tmp_path, GOOD | {"rollout_id": "ok"}, mutate(path, value))
    with pytest.raises(TrajectoryFormatError) as err:
        list(read_rollouts(p))
    msg = str(err.value)
    assert msg.startswith(f"{p}:2: {field}: "), msg
    assert problem in msg
    assert "\n" not in msg


def test_invalid_json_and_duplicate_rollouts(tmp_path):
    p = write_lines(tmp_path, GOOD, "{not json")
    with pytest.raises(TrajectoryFormatError, match=r":2: <line>: invalid JSON"):
        list(read_rollouts(p))
    p = write_lines(tmp_path, GOOD, GOOD)
    with pytest.raises(TrajectoryFormatError, match=r":2: rollout_id: duplicate rollout id 'r-1'"):
        list(read_rollouts(p))


def test_bytes_that_are_not_utf8_are_located(tmp_path):
    p = write_lines(tmp_path, GOOD)
    p.write_bytes(p.read_bytes() + b"\x00\xff\n")
    with pytest.raises(TrajectoryFormatError, match=r":2: <line>: not UTF-8 text"):
        list(read_rollouts(p))


@settings(max_examples=60, deadline=None)
@given(logs())
def test_round_trip_preserves_sequences(tmp_path_factory, rollouts):
    path = tmp_path_factory.mktemp("rt") / "log.jsonl"
    for compress in (False, True):
        write_rollouts(path, rollouts, compress=compress)
        back = list(read_rollouts(path))
        assert [full_sequences(r) for r in back] == [full_sequences(r) for r in rollouts]
        for a, b in zip(rollouts, back, strict=True):
            assert (a.rollout_id, a.group_id, a.status, a.progress, a.score) == (
                b.rollout_id,
                b.group_id,
                b.status,
                b.progress,
                b.score,
            )
            for ca, cb in zip(a.calls, b.calls, strict=True):
                assert ca.prompt_len == cb.prompt_len
                assert np.allclose(ca.logprobs, cb.logprobs) and (ca.versions == cb.versions).all()


def test_writer_uses_prefix_when_a_call_extends_another(tmp_path):
    ids = lambda *x: np.asarray(x, dtype=np.int64)  # noqa: E731
    calls = [
        Call("a", ids(1, 2, 3), ids(4), np.array([-0.1]), ids(0)),
        Call("b", ids(1, 2, 3, 4, 5, 6), ids(7), np.array([-0.1]), ids(0)),
        Call("c", ids(1, 2, 8), ids(), np.array([]), ids()),
    ]
    obj = rollout_to_json(Rollout("r", "t", "completed", 1.0, calls))
    assert "prefix" not in obj["calls"][1]  # rollout_to_json writes calls as given
    path = tmp_path / "w.jsonl"
    write_rollouts(path, [Rollout("r", "t", "completed", 1.0, calls)])
    written = json.loads(path.read_text())["calls"]
    assert written[1]["prefix"] == {"call_id": "a", "tokens": 4}
    assert written[1]["prompt_ids"] == [5, 6]
    assert written[2]["prefix"] == {"call_id": "b", "tokens": 2}
    assert written[2]["prompt_ids"] == [8]


def test_the_documented_example_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "trajectory.jsonl"
    rollouts = list(read_rollouts(example))
    assert {c.kind for r in rollouts for c in r.calls} == {
        "continue",
        "compaction",
        "subagent",
        "retry",
    }
    assert any(c.prefix is not None for r in rollouts for c in r.calls)
