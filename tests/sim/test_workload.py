"""Workload traces: the reader's located messages, round trips and the generators' regimes."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gyre_core.sim.workload import (
    BURST_BLOCKS,
    BURST_EVERY,
    COMPACT_AT,
    CONTEXT_WINDOW,
    PHASES,
    TraceFormatError,
    TraceRollout,
    Turn,
    describe,
    estimated_duration_s,
    generate,
    read_trace,
    rollout_to_json,
    write_trace,
)

GOOD: dict[str, Any] = {
    "rollout_id": "a",
    "task_id": "t-1",
    "turns": [
        {"prompt_tokens": 10, "completion_tokens": 5, "tool_s": 1.5},
        {"prompt_tokens": 3, "completion_tokens": 2, "tool_s": 0, "compact_to": 6},
        {"prompt_tokens": 4, "completion_tokens": 1, "tool_s": 0.25},
    ],
    "timeout_s": 7200,
}


def write_lines(tmp_path: Path, *objs: Any) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return p


def mutate(path: str, value: Any) -> dict[str, Any]:
    """GOOD with ``path`` (dotted, list indices as numbers) set to ``value`` or deleted."""
    obj = copy.deepcopy(GOOD)
    *head, last = path.split(".")
    target: Any = obj
    for part in head:
        target = target[int(part)] if part.isdigit() else target[part]
    key: Any = int(last) if last.isdigit() else last
    if value is KeyError:
        del target[key]
    else:
        target[key] = value
    return obj


def test_helpers_and_defaults(tmp_path):
    (r,) = read_trace(write_lines(tmp_path, "", mutate("rollout_id", KeyError)))
    assert (r.rollout_id, r.task_id, r.group_id, r.timeout_s) == ("r-2", "t-1", "t-1", 7200.0)
    assert r.turns[1] == Turn(3, 2, 0.0, 6) and r.turns[0].compact_to is None
    # 10; then 10 + 5 + 3 = 18, compacted to 6 after the call; then 6 + 4.
    assert r.contexts().tolist() == [10, 18, 10]
    assert r.max_context == 18 and r.total_completion_tokens == 8
    # The last tool time does not count: a rollout ends with its last call.
    assert estimated_duration_s(r) == pytest.approx(17 / 20_000 + 8 / 40 + 1.5)
    assert estimated_duration_s(r, decode_tok_s=8.0, prefill_tok_s=17.0) == pytest.approx(3.5)


def test_round_trip(tmp_path):
    hand = TraceRollout("x", "t", "g", (Turn(7, 1, 0.5, None), Turn(0, 3, 2.0, 4)), 60.0)
    rollouts = [hand, *generate("mixed", 40, seed=1, group_size=4)]
    path = tmp_path / "trace.jsonl"
    write_trace(path, rollouts)
    assert read_trace(path) == rollouts
    # Generated turns are ordinary frozen Turns.
    t = rollouts[1].turns[0]
    built = Turn(t.prompt_tokens, t.completion_tokens, t.tool_s, t.compact_to)
    assert t == built and hash(t) == hash(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.tool_s = 0.0  # type: ignore[misc]
    assert len(path.read_text().splitlines()) == 41


BAD = [
    ("", [1], "<line>", "expected a JSON object, got [1]"),
    ("color", "red", "<line>", "unknown field 'color' (known: rollout_id, task_id, group_id, "),
    ("task_id", KeyError, "task_id", "missing required field"),
    ("task_id", 7, "task_id", "expected a non-empty string, got 7"),
    ("group_id", "", "group_id", 'expected a non-empty string, got ""'),
    ("rollout_id", None, "rollout_id", "expected a non-empty string, got null"),
    ("turns", KeyError, "turns", "missing required field"),
    ("turns", [], "turns", "expected a non-empty list of turns, got []"),
    ("turns", {}, "turns", "expected a non-empty list of turns, got {}"),
    ("turns.1", 5, "turns[1]", "expected a JSON object, got 5"),
    ("turns.1.compactTo", 5, "turns[1]", "unknown field 'compactTo'"),
    ("turns.0.prompt_tokens", KeyError, "turns[0].prompt_tokens", "missing required field"),
    ("turns.1.prompt_tokens", -1, "turns[1].prompt_tokens", "must be >= 0, got -1"),
    ("turns.1.prompt_tokens", 2.5, "turns[1].prompt_tokens", "expected an integer, got 2.5"),
    ("turns.0.prompt_tokens", 0, "turns[0].prompt_tokens", "must be >= 1, got 0"),
    ("turns.2.completion_tokens", 0, "turns[2].completion_tokens", "must be >= 1, got 0"),
    ("turns.2.completion_tokens", True, "turns[2].completion_tokens", "expected an integer"),
    ("turns.0.tool_s", KeyError, "turns[0].tool_s", "missing required field"),
    ("turns.0.tool_s", -0.5, "turns[0].tool_s", "must be >= 0, got -0.5"),
    ("turns.0.tool_s", "3", "turns[0].tool_s", 'expected a number of seconds, got "3"'),
    ("turns.1.compact_to", 0, "turns[1].compact_to", "must be >= 1, got 0"),
    ("turns.1.compact_to", 2.5, "turns[1].compact_to", "expected an integer, got 2.5"),
    (
        "turns.1.compact_to",
        21,
        "turns[1].compact_to",
        "21 exceeds the 20 tokens of the context it compacts",
    ),
    ("timeout_s", KeyError, "timeout_s", "missing required field"),
    ("timeout_s", 0, "timeout_s", "must be > 0, got 0"),
    ("timeout_s", -5.0, "timeout_s", "must be > 0, got -5.0"),
    ("timeout_s", False, "timeout_s", "expected a number of seconds, got false"),
]


@pytest.mark.parametrize(("path", "value", "field", "problem"), BAD)
def test_bad_input_is_one_located_line(tmp_path, path, value, field, problem):
    bad = value if path == "" else mutate(path, value)
    p = write_lines(tmp_path, GOOD, "   ", bad)
    with pytest.raises(TraceFormatError) as err:
        read_trace(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}:3: {field}: {problem}"), msg
    assert "\n" not in msg
    assert (err.value.line, err.value.field) == (3, field)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], ":2: <line>: invalid JSON: Expecting property name"),
        (
            [mutate("timeout_s", float("nan"))],
            ":2: timeout_s: expected a finite number of seconds, got nan",
        ),
        (
            [mutate("turns.0.tool_s", float("inf"))],
            ":2: turns[0].tool_s: expected a finite number of seconds, got inf",
        ),
        ([GOOD], ":2: rollout_id: duplicate rollout id 'a'"),
        # An explicit id may collide with the default one of a later line.
        ([mutate("rollout_id", "r-3"), mutate("rollout_id", KeyError)], ":3: rollout_id: dup"),
    ],
)
def test_json_numbers_and_duplicates(tmp_path, lines, message):
    p = write_lines(tmp_path, GOOD, *lines)
    with pytest.raises(TraceFormatError) as err:
        read_trace(p)
    assert str(err.value).startswith(f"{p}{message}"), str(err.value)


def test_generate_is_deterministic_and_grouped():
    a = generate("xlong", 20, seed=3)
    assert a == generate("xlong", 20, seed=3)
    assert a != generate("xlong", 20, seed=4)
    assert [r.turns for r in generate("mixed", 20, seed=3)] != [r.turns for r in a]
    sizes: dict[str, int] = {}
    for r in a:
        assert r.group_id == r.task_id
        sizes[r.task_id] = sizes.get(r.task_id, 0) + 1
    assert list(sizes.values()) == [8, 8, 4]
    assert len({r.rollout_id for r in a}) == 20
    assert generate("uniform", 0, seed=0) == []
    with pytest.raises(ValueError, match="unknown workload kind"):
        generate("huge", 4, seed=0)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def xlong() -> list[TraceRollout]:
    return generate("xlong", 2_000, seed=0)


def test_xlong_regime(xlong):
    d = describe(xlong)
    turns, dur, ctx = d["turns"], d["duration_s"], d["max_context"]
    assert dur["p99"] >= 10 * dur["p50"]
    assert 70 <= turns["p50"] <= 150
    assert 300 <= turns["p99"] <= turns["max"] <= 1_000
    assert 5 * 60 <= dur["p10"] <= 20 * 60  # ten minutes or so ...
    assert dur["p99"] >= 3 * 3_600  # ... to hours
    assert 0 < d["timeout_share"] < 0.1
    assert 800_000 <= ctx["max"] < CONTEXT_WINDOW
    assert 0.02 < d["compacted_share"] < 0.3


def test_xlong_compaction_rule(xlong):
    for r in xlong:
        ctx = r.contexts()
        ends = ctx + [t.completion_tokens for t in r.turns]
        assert ends.max() <= CONTEXT_WINDOW
        compacted = np.array([t.compact_to is not None for t in r.turns])
        assert not compacted[-1]
        # Compacted exactly after the calls that leave more than COMPACT_AT (but the last).
        assert (compacted[:-1] == (ends[:-1] > COMPACT_AT)).all()


def test_uniform_has_low_variance():
    rollouts = generate("uniform", 400, seed=0)
    durations = np.array([estimated_duration_s(r) for r in rollouts])
    assert durations.std() / durations.mean() < 0.1
    assert durations.max() < 1.5 * durations.min()
    d = describe(rollouts)
    assert d["timeout_share"] == 0 and d["compacted_share"] == 0


def test_mixed_has_short_and_long_tasks():
    d = describe(generate("mixed", 800, seed=0))
    assert d["turns"]["p50"] <= 8 and d["duration_s"]["p50"] < 5 * 60
    assert d["turns"]["p90"] >= 50 and d["duration_s"]["p99"] >= 2 * 3_600


def _quarters(rollouts, value):  # type: ignore[no-untyped-def]
    q = len(rollouts) // 4
    return [float(np.mean([value(r) for r in rollouts[i * q : (i + 1) * q]])) for i in range(4)]


def test_drift_lengthens_responses_over_the_trace():
    rollouts = generate("drift", 800, seed=0)
    means = _quarters(rollouts, lambda r: r.total_completion_tokens)
    assert means == sorted(means) and means[-1] > 2.5 * means[0]  # 0.5x -> 2x of uniform's
    assert describe(rollouts)["timeout_share"] == 0


def test_phases_alternate_chat_like_and_uniform_blocks():
    rollouts = generate("phases", 800, seed=0)
    block = len(rollouts) // PHASES
    turns = [float(np.mean([len(r.turns) for r in rollouts[i * block : (i + 1) * block]]))
             for i in range(PHASES)]  # fmt: skip
    assert all(t <= 8 for t in turns[0::2]) and all(t >= 35 for t in turns[1::2])


def test_bursts_are_chat_like_with_blocks_of_long_tasks():
    rollouts = generate("bursts", 1600, seed=0)
    block = len(rollouts) // BURST_BLOCKS
    long = [float(np.median([len(r.turns) for r in rollouts[i * block : (i + 1) * block]])) > 8
            for i in range(BURST_BLOCKS)]  # fmt: skip
    assert long == [i % BURST_EVERY == 1 for i in range(BURST_BLOCKS)]
    assert describe(rollouts)["duration_s"]["p99"] >= 3_600  # the bursts run for hours


def test_decode_turns_are_decode_bound_and_hour_long():
    rollouts = generate("decode", 400, 0)
    d = describe(rollouts)
    completion = sum(r.total_completion_tokens for r in rollouts)
    prompt = sum(t.prompt_tokens for r in rollouts for t in r.turns)
    assert completion / (completion + prompt) > 0.85  # decode-dominated turns
    assert 30 * 60 < d["duration_s"]["p50"] < 90 * 60  # about an hour at 40 tok/s
    assert d["timeout_share"] == 0.0 and d["compacted_share"] == 0.0


def test_adding_decode_left_the_other_kinds_unchanged():
    """Hashes of each kind's trace as generated before ``decode`` was added (KINDS order
    seeds the draws: ``decode`` is last)."""
    import hashlib

    before = {
        "xlong": "df2988e8fa78094e",
        "mixed": "0a6943a337d2df77",
        "uniform": "bac88e90289a61f9",
        "drift": "2982304300b66a35",
        "phases": "30c522e0b91db8e8",
        "bursts": "8914619bdc78798c",
    }
    for kind, digest in before.items():
        h = hashlib.sha256()
        for r in generate(kind, 40, 1):
            h.update(json.dumps(rollout_to_json(r), sort_keys=True).encode())
        assert h.hexdigest()[:16] == digest, kind
