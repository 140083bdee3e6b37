from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_core.trajectory.format import KINDS, Rollout, full_sequences, parse_rollout, read_rollouts
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.synth import PRESETS, SynthConfig, synth_rollouts
from gyre_core.trajectory.tree import build_trees
from gyre_core.trajectory.writer import rollout_to_json, write_rollouts


@cache
def generated(name: str) -> tuple[Rollout, ...]:
    return tuple(synth_rollouts(PRESETS[name]))


def same_rollouts(a: list[Rollout] | tuple[Rollout, ...], b: list[Rollout]) -> None:
    """Equal up to the choice of prefixes: same metadata and same full sequences."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.rollout_id, x.task_id, x.group_id, x.status) == (
            y.rollout_id, y.task_id, y.group_id, y.status,
        )  # fmt: skip
        assert x.progress == y.progress and x.score == y.score
        fx, fy = full_sequences(x), full_sequences(y)
        assert list(fx) == list(fy)
        for cx, cy in zip(x.calls, y.calls, strict=True):
            assert (cx.agent, cx.kind, cx.full_len) == (cy.agent, cy.kind, cy.full_len)
            np.testing.assert_array_equal(fx[cx.call_id], fy[cy.call_id])
            np.testing.assert_allclose(cx.logprobs, cy.logprobs, atol=1e-6)
            np.testing.assert_array_equal(cx.versions, cy.versions)


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize("name", ["tiny", "agentic"])
def test_deterministic_for_a_seed(name: str) -> None:
    cfg = PRESETS[name]
    one = [rollout_to_json(r) for r in synth_rollouts(cfg)]
    two = [rollout_to_json(r) for r in synth_rollouts(cfg)]
    assert one == two
    other = [rollout_to_json(r) for r in synth_rollouts(dataclasses.replace(cfg, seed=1))]
    assert one != other


@pytest.mark.parametrize("name", ["tiny", "agentic"])
def test_written_file_validates_and_round_trips(name: str, tmp_path: Path) -> None:
    rollouts = generated(name)
    path = tmp_path / f"{name}.jsonl"
    assert write_rollouts(path, rollouts) == len(rollouts)
    same_rollouts(rollouts, list(read_rollouts(path)))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    groups=st.integers(1, 3),
    group_size=st.integers(1, 4),
    turns=st.floats(1, 12),
    probs=st.tuples(*[st.sampled_from([0.0, 0.3, 1.0])] * 4),
    compaction_every=st.integers(0, 4),
    capped=st.booleans(),
    version=st.sampled_from([0, 5, (0, 3)]),
)
def test_random_configs_validate(
    seed: int,
    groups: int,
    group_size: int,
    turns: float,
    probs: tuple[float, float, float, float],
    compaction_every: int,
    capped: bool,
    version: int | tuple[int, int],
) -> None:
    sub, retry, opening, timeout = probs
    cfg = SynthConfig(
        groups=groups, group_size=group_size, turns=turns, prompt_tokens=3,
        completion_tokens=5, tool_tokens=8, system_tokens=10, vocab_size=50,
        compaction_every=compaction_every, summary_tokens=4, subagent_prob=sub,
        retry_prob=retry, shared_opening_prob=opening, timeout_prob=timeout * 0.5,
        fail_prob=timeout * 0.5, seed=seed, max_context=400 if capped else None,
        version=version,
    )  # fmt: skip
    rollouts = list(synth_rollouts(cfg))
    assert len(rollouts) == groups * group_size
    buf = io.StringIO()
    write_rollouts(buf, rollouts, compress=False)
    back = [parse_rollout(json.loads(line)) for line in buf.getvalue().splitlines()]
    same_rollouts(rollouts, back)
    lo, hi = cfg.version_range
    for r in rollouts:
        versions = np.concatenate([c.versions for c in r.calls])
        assert lo <= versions.min() and versions.max() <= hi
        assert (np.diff(versions) >= 0).all()  # a rollout never goes back in policy version
        assert all((c.completion_ids < 50).all() and (c.logprobs <= 0).all() for c in r.calls)
        if capped:
            assert max(c.full_len for c in r.calls if c.agent == "main") <= 400


def test_bad_configs_are_refused() -> None:
    for bad in (
        {"groups": 0},
        {"turns": 0.5},
        {"retry_prob": 1.5},
        {"timeout_prob": 0.7, "fail_prob": 0.7},
        {"version": (3, 1)},
        {"vocab_size": 1},
        {"max_context": 2000},
    ):
        with pytest.raises(ValueError):
            SynthConfig(**bad)


# --------------------------------------------------------------------------- structure


def test_group_sizes_are_as_configured() -> None:
    for name in ("tiny", "agentic"):
        cfg, rollouts = PRESETS[name], generated(name)
        sizes = Counter(r.group_id for r in rollouts)
        assert len(sizes) == cfg.groups and set(sizes.values()) == {cfg.group_size}
        for gid in sizes:
            members = [r for r in rollouts if r.group_id == gid]
            assert len({r.task_id for r in members}) == 1
            prompts = {r.calls[0].prompt_ids[: cfg.system_tokens].tobytes() for r in members}
            assert len(prompts) == 1  # one task prompt a group
        assert len({r.task_id for r in rollouts}) == cfg.groups


def test_agentic_has_every_branch_kind_with_its_relation() -> None:
    cfg, rollouts = PRESETS["agentic"], generated("agentic")
    kinds = Counter(c.kind for r in rollouts for c in r.calls)
    # every kind the harness writes ("branch" is the endpoint's: an external agent's call)
    assert set(kinds) == set(KINDS) - {"branch"} and min(kinds.values()) >= 10
    assert {r.status for r in rollouts} == {"completed", "timeout", "failed"}
    for r in rollouts:
        by_id = {c.call_id: c for c in r.calls}
        seqs = full_sequences(r)
        last: dict[str, str] = {}  # agent -> its latest call
        for c in r.calls:
            ref = by_id[c.prefix.call_id] if c.prefix else None
            if c is r.calls[0]:  # the task prompt and a first prompt
                assert c.kind == "continue" and c.prefix is None and c.agent == "main"
            elif c.kind == "continue":
                assert ref is not None and ref.call_id == last[c.agent]
                assert c.prefix is not None and c.prefix.tokens == ref.full_len
            elif c.kind == "compaction":  # task prompt, then the summary just written
                assert ref is r.calls[0] and c.prefix is not None
                assert c.prefix.tokens == cfg.system_tokens
                summary = by_id[last["main"]].completion_ids
                np.testing.assert_array_equal(c.prompt_ids[: len(summary)], summary)
            elif c.kind == "retry":  # resample from a save point: a strict prefix
                assert ref is not None and ref.agent == "main" and len(c.prompt_ids) == 0
                assert c.prefix is not None and c.prefix.tokens == ref.prompt_len < ref.full_len
            else:
                assert c.kind == "subagent" and c.agent.startswith("sub-")
                assert c.agent not in last  # a fresh context
                task = by_id[last["main"]].completion_ids[-64:]  # the parent's request
                start = c.prompt_len - len(task)  # the full prompt ends with it
                np.testing.assert_array_equal(seqs[c.call_id][start : c.prompt_len], task)
            last[c.agent] = c.call_id
    # A sub-agent's final completion comes back in the next main call's tool output.
    returned = 0
    for r in rollouts:
        for i, c in enumerate(r.calls[:-1]):
            nxt = r.calls[i + 1]
            if c.agent.startswith("sub-") and nxt.agent == "main" and nxt.kind == "continue":
                result = c.completion_ids  # after an 8-token wrapper
                np.testing.assert_array_equal(nxt.prompt_ids[8 : 8 + len(result)], result)
                returned += 1
    assert returned >= 10


def test_agentic_dedups_at_least_3x_over_per_branch() -> None:
    stats = tree_stats(build_trees(generated("agentic")).values())
    assert stats["tokens_per_branch"] >= 3 * stats["tokens_unique"]
    assert stats["tokens_per_call"] >= stats["tokens_per_branch"] >= stats["tokens_unique"]


def test_shared_openings_and_varied_versions() -> None:
    rollouts = generated("agentic")
    shared = 0
    for gid in {r.group_id for r in rollouts}:
        firsts = [r.calls[0].completion_ids for r in rollouts if r.group_id == gid]
        shared += sum(a[0] == b[0] for i, a in enumerate(firsts) for b in firsts[:i])
    assert shared >= 3
    assert any(len(set(c.versions.tolist())) > 1 for r in rollouts for c in r.calls)
    assert len({int(c.versions[0]) for r in rollouts for c in r.calls}) > 2


def test_progress_is_partial_credit() -> None:
    rollouts = [r for name in ("tiny", "agentic") for r in generated(name)]
    timeouts = [r for r in rollouts if r.status != "completed"]
    assert timeouts and all(0.0 <= r.progress < 1.0 for r in timeouts)
    assert any(r.progress > 0 for r in timeouts)
    completed = [r.progress for r in rollouts if r.status == "completed"]
    assert 1.0 in completed and min(completed) < 1.0
    assert all(r.score == r.progress for r in rollouts)
    assert all(abs(r.progress * 20 - round(r.progress * 20)) < 1e-9 for r in rollouts)


# --------------------------------------------------------------------------- scale


@pytest.mark.slow
def test_long_preset_reaches_1e7_tokens_in_a_small_file(tmp_path: Path) -> None:
    cfg = PRESETS["long"]
    rollouts = list(synth_rollouts(cfg))
    tokens_per_call = sum(c.full_len for r in rollouts for c in r.calls)
    assert tokens_per_call >= 10**7  # measured 1.4e8 (3e7 or more over seeds 0-39)
    assert len(rollouts) == cfg.groups * cfg.group_size
    main_lens = [c.full_len for r in rollouts for c in r.calls if c.agent == "main"]
    assert cfg.max_context is not None and 80_000 <= max(main_lens) <= cfg.max_context
    assert sum(len(r.calls) for r in rollouts) >= 400
    assert any(c.kind == "compaction" for r in rollouts for c in r.calls)  # forced by the cap
    # The calls carry their prefixes already: written as they are, the file is linear.
    path = tmp_path / "long.jsonl"
    write_rollouts(path, rollouts, compress=False)
    size = path.stat().st_size
    assert size < 100_000_000  # measured 16.6 MB; ~1 GB if every call held its whole prompt
    assert size < tokens_per_call / 4  # linear in the distinct tokens, not in the calls
    back = list(read_rollouts(path))
    assert sum(c.full_len for r in back for c in r.calls) == tokens_per_call
    assert [r.progress for r in back] == [r.progress for r in rollouts]
