"""Failed rollouts in a step: infrastructure failures stay out of their group's statistics
and are not trained, a group left with fewer than two scored rollouts trains nothing, an
all-failed group or an empty tree is a step with nothing to train (never an error)."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_core.train.config import TrainConfig
from gyre_core.train.losses import count_fresh
from gyre_core.train.trainer import BatchPlan
from gyre_core.trajectory.failures import left_out, step_figures
from gyre_core.trajectory.format import Call, Rollout
from gyre_core.trajectory.rewards import Weighting


def rollout(rid: str, group: str, reward: float, *, status: str = "completed",
            failure: str = "", calls: int = 1, first: int = 0) -> Rollout:  # fmt: skip
    """A rollout of ``calls`` one-turn calls on a prompt shared by its group; its completion
    tokens are its own (``first`` + its index), so what it alone trained is visible."""
    made = []
    for i in range(calls):
        own = np.array([first + 10 * i + 5, first + 10 * i + 6], np.int64)
        made.append(Call(f"c{i}", np.array([1, 2], np.int64), own, np.full(2, -0.5),
                         np.zeros(2, np.int64)))  # fmt: skip
    return Rollout(rid, "t", status, reward, made, group, reward, {}, failure)


def advantages(rollouts: list[Rollout], std: bool = False) -> dict[str, float]:
    """Each rollout's advantage in its group's weighed tree (None: not in the tree)."""
    out = {}
    for tree in Weighting("once", std).trees(rollouts).values():
        adv = Weighting("once", std).apply(tree)
        out.update({info.rollout_id: a for info, a in zip(tree.rollouts, adv, strict=True)})
    return out


def test_infrastructure_failures_stay_out_of_group_statistics() -> None:
    batch = [
        rollout("a", "g", 1.0, first=100),
        rollout("b", "g", 0.5, first=200),
        rollout("env", "g", 0.0, status="failed", failure="environment", first=300),
        rollout("eng", "g", 0.0, status="failed", failure="engine", calls=0),
        rollout("early", "g", 0.0, status="failed", calls=0),  # agent, before any call
    ]
    # mean over the scored 1.0 and 0.5 only: no fake zero drags it down
    assert advantages(batch) == {"a": pytest.approx(0.25), "b": pytest.approx(-0.25)}
    assert advantages(batch, std=True)["a"] == pytest.approx(1.0, abs=1e-4)
    trees = Weighting("once", False).trees(batch)
    (tree,) = trees.values()
    tokens = {int(t) for n in tree.nodes() for t in n.tokens[n.generated]}
    assert tokens == {105, 106, 205, 206}, "an excluded rollout's tokens were kept"
    assert [left_out(r) for r in batch] == [
        "", "", "excluded_environment", "excluded_engine", "excluded_agent"
    ]  # fmt: skip


def test_legitimate_zeros_count() -> None:
    """A completed 0, a timeout (partial credit) and an agent failure after its calls are
    scored: they stay in the group."""
    batch = [
        rollout("win", "g", 1.0, first=100),
        rollout("zero", "g", 0.0, first=200),
        rollout("late", "g", 0.25, status="timeout", first=300),
        rollout("crash", "g", 0.0, status="failed", failure="agent", first=400),
    ]
    adv = advantages(batch)
    assert set(adv) == {"win", "zero", "late", "crash"}
    assert adv["win"] == pytest.approx(1.0 - 1.25 / 4)


def test_a_group_with_fewer_than_two_scored_rollouts_trains_nothing() -> None:
    batch = [
        rollout("a", "g", 1.0),
        rollout("b", "g", 0.0, status="failed", failure="evaluation"),
        rollout("c", "h", 1.0, first=100),
        rollout("d", "h", 0.0, first=200),
    ]
    trees = Weighting("per_path", True).trees(batch)
    weights = {g: np.concatenate([n.weight for n in t.nodes()]) for g, t in trees.items()}
    assert not weights["g"].any() and weights["h"].any()
    figures = step_figures(batch, trees, 64)
    assert (figures["dropped_evaluation"], figures["groups_untrained"]) == (1.0, 1.0)


def test_an_all_failed_batch_is_a_step_with_nothing_to_train() -> None:
    """Every rollout failed before its first call (an agent that cannot import, a bad key):
    no tree, no sample, a skipped step rather than an error."""
    batch = [rollout(f"r{i}", f"g{i % 2}", 0.0, status="failed", calls=0) for i in range(4)]
    plan = BatchPlan(TrainConfig(max_tokens=64), staleness_bound=2)
    trees = plan.weigh(batch, 0)
    samples = plan.prepare(batch, 0, trees)
    assert trees == {} and samples == [] and count_fresh(samples, 0, 2) == 0
    assert plan.skipped(samples, 0)["skipped"] == 1.0
    figures = step_figures(batch, trees, 64)
    assert (figures["excluded_agent"], figures["groups_untrained"]) == (4.0, 2.0)


def test_an_empty_tree_packs_to_nothing() -> None:
    """Completed rollouts that made no call give their group an empty tree: packing skips
    it (it crashed with an IndexError) and counts it."""
    batch = [rollout("a", "g", 1.0, calls=0), rollout("b", "g", 0.0, calls=0)]
    batch += [rollout("c", "h", 1.0, first=100), rollout("d", "h", 0.0, first=200)]
    plan = BatchPlan(TrainConfig(max_tokens=64), staleness_bound=2)
    trees = plan.weigh(batch, 0)
    samples = plan.prepare(batch, 0, trees)
    assert len(samples) == 1 and samples[0].group_ids == ["h"]
    assert step_figures(batch, trees, 64)["empty_trees"] == 1.0


def test_an_overlong_rollout_is_cut_not_an_error() -> None:
    """A rollout longer than train.max_tokens is cut at that depth and counted."""
    long_call = Call("c0", np.arange(1, 9, dtype=np.int64), np.arange(20, 28, dtype=np.int64),
                     np.full(8, -0.5), np.zeros(8, np.int64))  # fmt: skip
    batch = [Rollout("a", "t", "completed", 1.0, [long_call], "g"), rollout("b", "g", 0.0)]
    plan = BatchPlan(TrainConfig(max_tokens=12), staleness_bound=2)
    trees = plan.weigh(batch, 0)
    samples = plan.prepare(batch, 0, trees)
    assert all(len(s) <= 12 for s in samples)
    # the long path holds 16 positions: 4 at depth >= 12 are cut
    assert step_figures(batch, trees, 12)["tokens_cut"] == 4.0
    trained = sorted(int(t) for s in samples for t in s.input_ids[s.trainable])
    assert trained == [5, 6, 20, 21, 22, 23]
