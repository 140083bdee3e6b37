"""A small log worked by hand: the tree, the weights of both modes and the packing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gyre_core.trajectory.format import FORMAT, parse_rollout
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.rewards import assign_weights, binary_reward, group_advantages
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.tree import build_trees


def call(
    cid: str, prompt: list[int], completion: list[int], prefix: Any = None, kind: str = "continue"
) -> dict[str, Any]:
    d = {"call_id": cid, "prompt_ids": prompt, "completion_ids": completion, "kind": kind,
         "logprobs": [-0.5] * len(completion), "versions": 1}  # fmt: skip
    if prefix:
        d["prefix"] = {"call_id": prefix[0], "tokens": prefix[1]}
    return d


# Rollout a (progress 1.0): [1 2 3] -> 4 5, then continues -> 6 | 7 8, then compacts
# back to [1 2 3] + 9 -> 10. Rollout b (timeout, progress 0.5) shares the opening token 4
# but then generates 11. Advantages: a +0.25, b -0.25.
A = {"format": FORMAT, "rollout_id": "a", "task_id": "t", "group_id": "g", "status": "completed",
     "progress": 1.0, "calls": [call("c1", [1, 2, 3], [4, 5]), call("c2", [6], [7, 8], ("c1", 5)),
                                call("c3", [9], [10], ("c1", 3), "compaction")]}  # fmt: skip
B = {"format": FORMAT, "rollout_id": "b", "task_id": "t", "group_id": "g", "status": "timeout",
     "progress": 0.5, "calls": [call("c1", [1, 2, 3], [4, 11])]}  # fmt: skip


@pytest.fixture
def tree():
    return build_trees([parse_rollout(A), parse_rollout(B)])["g"]


def test_nodes_are_maximal_segments_with_kinds(tree) -> None:
    got = [(n.start, n.tokens.tolist(), n.generated.astype(int).tolist(), tree.branch_kind(n))
           for n in tree.nodes()]  # fmt: skip
    assert got == [
        (0, [1, 2, 3], [0, 0, 0], "continue"),
        (3, [4], [1], "continue"),
        (4, [5], [1], "continue"),  # c1 of a ends here, c2 extends it
        (5, [6, 7, 8], [0, 1, 1], "continue"),
        (4, [11], [1], "continue"),
        (3, [9, 10], [0, 1], "compaction"),
    ]
    first = next(tree.nodes())
    assert tree.rollouts_through(first) == [0, 1]
    assert [tree.calls[c].call_id for c in tree.calls_through(first)] == ["c1", "c2", "c3", "c1"]


def test_stats_by_hand(tree) -> None:
    s = tree_stats([tree])
    assert (s["tokens_per_call"], s["tokens_per_branch"], s["tokens_unique"]) == (
        5 + 8 + 5 + 5,
        8 + 5 + 5,
        11,
    )
    assert s["trainable_tokens_unique"] == 6
    assert s["rollouts_by_status"] == {"completed": 1, "timeout": 1}


def test_weights_once_and_per_path(tree) -> None:
    assert group_advantages([1.0, 0.5]) == [0.25, -0.25]
    assign_weights(tree, mode="once")
    w = {tuple(n.tokens.tolist()): n.weight.tolist() for n in tree.nodes()}
    assert w[(4,)] == [0.0]  # both generated it: mean(+0.25, -0.25)
    assert w[(5,)] == [0.25] and w[(6, 7, 8)] == [0.0, 0.25, 0.25] and w[(11,)] == [-0.25]
    assign_weights(tree, mode="per_path")
    w = {tuple(n.tokens.tolist()): n.weight.tolist() for n in tree.nodes()}
    # a has two branches, [..5 6 7 8] and [1 2 3 9 10]; only the first passes 4 and 5.
    assert w[(4,)] == [0.0] and w[(5,)] == [0.25] and w[(9, 10)] == [0.0, 0.25]
    assign_weights(tree, mode="per_path", advantages=[1.0, 2.0])
    assert next(n for n in tree.nodes() if n.tokens.tolist() == [4]).weight.tolist() == [3.0]


def test_std_normalisation_and_binary_reward() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], normalise_std=True)
    assert np.allclose(adv, [1, -1, -1, 1], atol=1e-5)
    assert group_advantages([0.3, 0.3], normalise_std=True) == [0.0, 0.0]
    assert [binary_reward(p) for p in (0.0, 0.99, 1.0)] == [0.0, 0.0, 1.0]


def test_packing_splits_with_context(tree) -> None:
    assign_weights(tree, mode="once")
    (whole,) = pack_trees([tree], 11)
    assert len(whole) == 11 and whole.trainable.sum() == 6
    samples = pack_trees([tree], 8)
    assert all(len(s) <= 8 for s in samples)
    assert sum(int(s.trainable.sum()) for s in samples) == 6
    context = sum(len(s) for s in samples) - 11
    assert 0 < context <= 8  # some path from the root is repeated, never a whole sample
