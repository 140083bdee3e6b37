"""Bounded path sampling (train.max_paths) on small trees worked by hand: the leaves'
roles, the role order, the proportional seeded draw, masking, pruning, the figures."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from gyre_core.config import RunConfig, run_path_sampling
from gyre_core.errors import ConfigError
from gyre_core.train.config import TrainConfig
from gyre_core.train.trainer import BatchPlan
from gyre_core.trajectory.format import FORMAT, Rollout, parse_rollout
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.paths import (
    ROLES,
    PathSampling,
    candidates,
    parse_roles,
    path_figures,
)
from gyre_core.trajectory.rewards import Weighting
from gyre_core.trajectory.tree import PrefixTree, build_trees


def call(
    cid: str,
    prompt: list[int],
    completion: list[int],
    prefix: Any = None,
    kind: str = "continue",
    agent: str = "main",
) -> dict[str, Any]:
    d = {"call_id": cid, "prompt_ids": prompt, "completion_ids": completion, "kind": kind,
         "agent": agent, "logprobs": [-0.5] * len(completion), "versions": 1}  # fmt: skip
    if prefix:
        d["prefix"] = {"call_id": prefix[0], "tokens": prefix[1]}
    return d


def rollout(rid: str, calls: list[dict[str, Any]], progress: float = 1.0) -> Rollout:
    head = {"format": FORMAT, "rollout_id": rid, "task_id": "t", "group_id": "g"}
    return parse_rollout({**head, "status": "completed", "progress": progress, "calls": calls})


# Rollout "a", as Gyre's harness records it: the main agent works ([1 2 3] -> 4 5, then 6 ->
# 7 8), writes a summary (a call labelled compaction extending its context: 30 -> 31 32 33),
# resumes from the task prompt (40 -> 41 42); a sub-agent works (50 51 -> 52..56), writes
# its summary (57 -> 58 59) and resumes (60 -> 61). Leaves and a's generated tokens on them:
# main [40 41 42]: 2; main_summary [... 31 32 33]: 7; subagent [60 61]: 1;
# subagent_summary [... 58 59]: 7.
A = [
    call("c1", [1, 2, 3], [4, 5]),
    call("c2", [6], [7, 8], ("c1", 5)),
    call("c3", [30], [31, 32, 33], ("c2", 8), "compaction"),
    call("c4", [40], [41, 42], ("c1", 3)),
    call("s1", [50, 51], [52, 53, 54, 55, 56], None, "subagent", "sub"),
    call("s2", [57], [58, 59], ("s1", 7), "compaction", "sub"),
    call("s3", [60], [61], ("s1", 2), "continue", "sub"),
]
# Rollout "b": three main leaves under [1 2 3]: 4 5 (2 tokens), a retry 9 (1), another 10 11
# 12 (3).
B = [
    call("c1", [1, 2, 3], [4, 5]),
    call("c2", [], [9], ("c1", 3), "retry"),
    call("c3", [], [10, 11, 12], ("c1", 3), "retry"),
]


def tree_of(*rollouts: Rollout) -> PrefixTree:
    return Weighting("once", False).trees(rollouts)["g"]


def taken_tokens(tree: PrefixTree) -> set[int]:
    """The token ids at taken generated positions (the ids are unique in these trees)."""
    return {int(t) for n in tree.nodes() for t in n.tokens[n.generated & n.taken]}


def test_roles_read_from_the_calls_as_the_harness_records_them() -> None:
    tree = tree_of(rollout("a", A))
    roles = {int(leaf.tokens[-1]): role for leaf, role in candidates(tree)[0]}
    assert roles == {42: "main", 33: "main_summary", 61: "subagent", 59: "subagent_summary"}


def test_roles_of_a_summary_whose_next_call_is_the_labelled_restart() -> None:
    # as the synthetic logs record a compaction: the summary is a plain continue, the call
    # resuming from the task prompt carries the label (and is itself a main leaf)
    calls = [
        call("c1", [1, 2, 3], [4, 5]),
        call("c2", [6], [7, 8], ("c1", 5)),  # the summary
        call("c3", [7, 8, 70], [71], ("c1", 3), "compaction"),  # restart, summary copied in
    ]
    tree = tree_of(rollout("a", calls))
    roles = {int(leaf.tokens[-1]): role for leaf, role in candidates(tree)[0]}
    assert roles == {8: "main_summary", 71: "main"}


@pytest.mark.parametrize(
    ("max_paths", "tokens"),
    [
        (1, {41, 42}),
        (2, {41, 42, 4, 5, 7, 8, 31, 32, 33}),
        (3, {41, 42, 4, 5, 7, 8, 31, 32, 33, 61}),
        (4, {41, 42, 4, 5, 7, 8, 31, 32, 33, 61, 52, 53, 54, 55, 56, 58, 59}),
    ],
)
def test_role_order_takes_main_then_summary_then_subagent(max_paths: int, tokens: set) -> None:
    tree = tree_of(rollout("a", A))
    PathSampling(max_paths).apply(tree, seed=3, version=0)
    assert taken_tokens(tree) == tokens
    assert len(tree.taken_paths[0]) == max_paths  # type: ignore[index]


def test_a_custom_order_and_a_role_left_out() -> None:
    tree = tree_of(rollout("a", A))
    PathSampling.of(2, "subagent_summary,subagent").apply(tree, seed=0, version=0)
    assert taken_tokens(tree) == {52, 53, 54, 55, 56, 58, 59, 61}
    tree = tree_of(rollout("a", A))
    PathSampling.of(0, "main").apply(tree, seed=0, version=0)  # every path of main leaves
    assert taken_tokens(tree) == {41, 42}


def test_roles_validated() -> None:
    assert parse_roles(" main , subagent") == ("main", "subagent")
    for bad in ("", "main,main", "main,boss", ","):
        with pytest.raises(ValueError, match="path roles"):
            parse_roles(bad)
    assert TrainConfig().path_sampling == PathSampling(0, ROLES)
    for train, field in (
        ({"path_roles": "main,boss"}, "path_roles"),
        ({"max_paths": -1}, "max_paths"),
    ):
        with pytest.raises(ConfigError, match=f"train.{field}"):
            RunConfig.from_dict({"train": train})
    cfg = RunConfig.from_dict({"seed": 4, "train": {"max_paths": 5, "path_roles": "subagent"}})
    assert run_path_sampling(cfg.to_dict()) == (PathSampling(5, ("subagent",)), 4)


def test_draw_is_proportional_to_untaken_tokens_and_seeded() -> None:
    first: Counter[int] = Counter()
    for seed in range(3000):
        tree = tree_of(rollout("b", B))
        PathSampling(1).apply(tree, seed=seed, version=7)
        (leaf,) = tree.taken_paths[0]  # type: ignore[index]
        first[int(leaf.tokens[-1])] += 1
    # leaves with 2, 1, 3 untaken tokens: drawn 2/6, 1/6, 3/6 of the time
    freq = {k: v / 3000 for k, v in first.items()}
    assert freq.keys() == {5, 9, 12}
    assert abs(freq[5] - 2 / 6) < 0.03 and abs(freq[9] - 1 / 6) < 0.03
    assert abs(freq[12] - 3 / 6) < 0.03
    # the same (seed, version, group, rollout) draws the same paths in the same order
    draws = []
    for _ in range(2):
        tree = tree_of(rollout("b", B))
        PathSampling(2).apply(tree, seed=11, version=7)
        draws.append([int(n.tokens[-1]) for n in tree.taken_paths[0]])  # type: ignore[index]
    assert draws[0] == draws[1] and len(draws[0]) == 2


def test_taken_tokens_leave_the_draw_and_everything_is_taken_at_last() -> None:
    tree = tree_of(rollout("b", B))
    PathSampling(10).apply(tree, seed=1, version=0)
    assert len(tree.taken_paths[0]) == 3  # type: ignore[index]  # then nothing untaken is left
    assert taken_tokens(tree) == {4, 5, 9, 10, 11, 12}


def test_masking_and_pruning_keep_the_shared_context() -> None:
    tree = tree_of(rollout("a", A), rollout("b", B, progress=0.0))
    PathSampling(1).apply(tree, seed=5, version=0)
    # a takes its main leaf; b one of its three leaves; every other position is untaken
    kept = {int(n.tokens[-1]) for n in tree.nodes()}
    b_leaf = int(tree.taken_paths[1][0].tokens[-1])  # type: ignore[index]
    assert kept == {3, 42, b_leaf}  # the shared [1 2 3] stays as context; the rest is pruned
    for n in tree.nodes():
        assert not n.taken[~n.generated].any()
    (sample,) = pack_trees([tree], 64)
    trained = set(sample.input_ids[sample.trainable].tolist())
    assert trained == taken_tokens(tree) and {41, 42} <= trained
    assert set(sample.input_ids.tolist()) >= {1, 2, 3}
    assert not ({52, 58, 31, 61} & set(sample.input_ids.tolist()))  # pruned: not packed
    figs = path_figures([tree])
    assert figs["paths_total"] == 4 + 3 and figs["paths_taken"] == 2
    assert figs["tokens_stored"] == 17 + 4  # a's 17 generated, b adds 9 10 11 12 (4 5 shared)
    assert figs["tokens_trained"] == len(trained)
    assert figs["tokens_context"] == sum(len(n) for n in tree.nodes()) - len(trained)


def test_max_paths_zero_packs_exactly_as_before() -> None:
    rollouts = [rollout("a", A), rollout("b", B, progress=0.0)]
    plain = pack_trees(Weighting("once", False).trees(rollouts).values(), 16)
    plan = BatchPlan(TrainConfig(max_tokens=64), staleness_bound=4, seed=9)
    trees = plan.weigh(rollouts, current_version=1)
    assert trees["g"].taken_paths is None
    for x, y in zip(plain, pack_trees(trees.values(), 16), strict=True):
        for key in ("input_ids", "position_ids", "parent", "trainable", "advantage", "version"):
            np.testing.assert_array_equal(getattr(x, key), getattr(y, key))
    assert path_figures(trees.values())["paths_taken"] == 7.0


def test_batch_plan_samples_with_the_run_seed_and_version() -> None:
    rollouts = [rollout("b", B)]
    cfg = TrainConfig(max_tokens=64, max_paths=1)

    def picked(seed: int, version: int) -> int:
        trees = BatchPlan(cfg, 4, seed).weigh(rollouts, version)
        return int(trees["g"].taken_paths[0][0].tokens[-1])  # type: ignore[index]

    again = tree_of(rollout("b", B))
    PathSampling(1).apply(again, seed=21, version=1)
    assert picked(21, 1) == int(again.taken_paths[0][0].tokens[-1])  # type: ignore[index]
    assert len({picked(s, 1) for s in range(30)}) == 3  # the seed moves the draw


def test_build_trees_untouched_without_sampling() -> None:
    tree = build_trees([rollout("a", A)])["g"]
    assert tree.taken_paths is None and all(n.taken.all() for n in tree.nodes())
