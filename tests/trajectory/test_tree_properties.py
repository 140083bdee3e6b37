"""The tree, its statistics, weights and packing against a naive reference, on random logs."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_core.trajectory.pack import pack_trees, tokens_cut
from gyre_core.trajectory.rewards import assign_weights
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.tree import build_trees
from tests.trajectory.naive import Naive, full_sequences
from tests.trajectory.strategies import logs

SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(logs())
def test_tree_positions_match_reference(rollouts):
    trees = build_trees(rollouts)
    ref = Naive(rollouts)
    seen = {}
    for t in trees.values():
        for node in t.nodes():
            path = np.concatenate([n.tokens for n in t.path(node)]).tolist()
            assert node.start == len(path) - len(node)
            for k in range(len(node)):
                key = (t.group_id, tuple(path[: node.start + k + 1]))
                assert key not in seen, "a position appears twice"
                seen[key] = (bool(node.generated[k]), float(node.logprob[k]), int(node.version[k]))
    assert set(seen) == set(ref.pos)
    for key, (gen, lp, ver) in seen.items():
        p = ref.pos[key]
        assert gen == p.generated
        if gen:
            assert (lp, ver) == (p.logprob, p.version)


@SETTINGS
@given(logs())
def test_calls_end_at_node_boundaries_and_paths_are_exact(rollouts):
    trees = build_trees(rollouts)
    by_id = {r.rollout_id: full_sequences(r) for r in rollouts}
    for t in trees.values():
        for i, c in enumerate(t.calls):
            seq = by_id[t.rollouts[c.rollout].rollout_id][t.rollouts[c.rollout].calls.index(i)]
            assert t.sequence(i).tolist() == seq
            assert c.node.end == len(seq) == c.full_len
            assert i in t.calls_through(c.node)
        for node in t.nodes():  # compressed: a node with one child has a call ending at it
            if len(node.children) == 1:
                assert node.ends


@SETTINGS
@given(logs())
def test_stats_match_reference(rollouts):
    ref = Naive(rollouts)
    s = tree_stats(build_trees(rollouts).values())
    assert s["tokens_unique"] == ref.tokens_unique
    assert s["trainable_tokens_unique"] == ref.trainable
    assert s["tokens_per_call"] == sum(len(x) for seqs in ref.seqs for x in seqs)
    assert s["tokens_per_branch"] == sum(len(k) for _, k in ref.leaves())
    assert s["calls"] == sum(len(r.calls) for r in rollouts)
    assert s["rollouts"] == len(rollouts)
    assert s["groups"] == len({r.group_id for r in rollouts})
    assert sum(s["calls_by_kind"].values()) == s["calls"]


@SETTINGS
@given(logs(), st.sampled_from(["once", "per_path"]), st.integers(1, 40))
def test_packing_invariants(rollouts, mode, max_tokens):
    trees = build_trees(rollouts)
    ref = Naive(rollouts)
    for t in trees.values():
        assign_weights(t, mode=mode)
    # a path longer than the bound is cut: positions at depth >= max_tokens (a key of
    # more than max_tokens tokens) are left out, and counted
    kept = {k: p for k, p in ref.pos.items() if len(k[1]) <= max_tokens}
    cut = sum(tokens_cut(t, max_tokens) for t in trees.values())
    assert cut == len(ref.pos) - len(kept)
    samples = pack_trees(trees.values(), max_tokens)
    trained: list[tuple[str, tuple[int, ...]]] = []
    for s in samples:
        assert 0 < len(s) <= max_tokens
        assert (s.parent < np.arange(len(s))).all()
        keys: list[tuple[int, ...]] = []
        for i in range(len(s)):
            p = int(s.parent[i])
            keys.append((keys[p] if p >= 0 else ()) + (int(s.input_ids[i]),))
            key = (s.group_ids[s.group[i]], keys[i])
            assert key in ref.pos, "a packed path that no call saw"
            assert s.position_ids[i] == len(keys[i]) - 1
            pos = ref.pos[key]
            if s.trainable[i]:
                assert pos.generated
                trained.append(key)
                assert math.isclose(s.advantage[i], ref.weight(key, mode), abs_tol=1e-9)
                assert (s.logprob[i], s.version[i]) == (pos.logprob, pos.version)
            else:
                assert s.advantage[i] == 0.0
    assert sorted(trained) == sorted(k for k, p in kept.items() if p.generated)
    assert len(set(trained)) == len(trained), "a generated token trained twice"
