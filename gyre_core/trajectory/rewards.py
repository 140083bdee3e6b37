"""Rewards, group-relative advantages and per-token loss weights on a prefix tree.

A rollout's reward defaults to its progress, so a rollout cut off by its time or token
budget (status ``timeout``) or one whose agent failed keeps the credit for what it reached.
The advantage is the reward minus the group mean, optionally divided by the group std,
over the group's scored rollouts: infrastructure and evaluation failures are left out of
the group (``gyre_core.trajectory.failures``), and a group of fewer than two trains nothing.

A rollout's *branches* are its maximal sequences: the end of one of its calls that no
later call of the same rollout extends. Per-branch linear training trains each branch
as its own sequence with the loss ``-sum(advantage * log pi)`` over the tokens that the
branch's rollout generated. Every branch ends at a node end, and a branch that ends at a
leaf is a root-to-leaf path.

Loss weight of a generated position ``p``, over the rollouts ``R(p)`` that generated it:

* ``once``: ``mean(A[r] for r in R(p))`` — the token is trained once;
* ``per_path``: ``sum(A[r] * branches_r(p) for r in R(p))`` where ``branches_r(p)``
  counts the branches of ``r`` through ``p``. The packed loss then equals per-branch
  linear training exactly, gradient included.

How the loss averages over tokens (``train.average``) is a per-position ``scale``
(:func:`set_scale`): 1 (``token``), or ``sum(1 / n_r for r in R(p))`` with ``n_r`` the
positions rollout ``r`` trains (``execution_then_batch``: per rollout, then over them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from gyre_core.registry import Registry
from gyre_core.trajectory.failures import scored
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.tree import Node, PrefixTree, build_trees

STD_EPS = 1e-6  # keeps a group whose rewards are all equal at advantage 0, not nan


def binary_reward(progress: float) -> float:
    """The all-or-nothing reward used as an ablation: 1 only for a finished task."""
    return 1.0 if progress >= 1.0 else 0.0


def group_advantages(rewards: list[float], *, normalise_std: bool = False) -> list[float]:
    """Each reward minus the group's mean (over its std with ``normalise_std``); all 0 for
    a group of fewer than two scored rollouts: nothing to compare with, nothing trained."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    r = np.asarray(rewards, dtype=np.float64)
    adv = r - r.mean()
    if normalise_std:
        adv = adv / (r.std() + STD_EPS)
    return [float(a) for a in adv]


def branch_ends(tree: PrefixTree) -> dict[int, set[Node]]:
    """Per rollout, the nodes at whose end one of its branches ends."""
    ends_by_rollout: dict[int, set[Node]] = defaultdict(set)
    for c in tree.calls:
        ends_by_rollout[c.rollout].add(c.node)
    out: dict[int, set[Node]] = {}
    for r, ends in ends_by_rollout.items():
        covered: set[Node] = set()  # nodes strictly above some end of r
        for e in ends:
            n = e.parent
            while n is not None and n not in covered:
                covered.add(n)
                n = n.parent
        out[r] = {e for e in ends if e not in covered}
    return out


# An advantage mode: a tree -> the loss weight of a span of a node, given the rollouts
# that generated it (sorted) and every rollout's advantage.
NodeWeight = Callable[[Node, list[int], np.ndarray], float]
AdvantageModeFn = Callable[[PrefixTree], NodeWeight]
ADVANTAGE_MODES: Registry[AdvantageModeFn] = Registry("advantage mode")
register_advantage_mode = ADVANTAGE_MODES.register


@register_advantage_mode("once")
def _once(tree: PrefixTree) -> NodeWeight:
    """The mean of the advantages of the rollouts that share the span."""
    return lambda node, rs, adv: float(adv[rs].mean())


@register_advantage_mode("per_path")
def _per_path(tree: PrefixTree) -> NodeWeight:
    """Each sharing rollout's advantage times its branches through the node, summed."""
    through = _branches_through(tree)
    return lambda node, rs, adv: float(sum(adv[r] * through[node][r] for r in rs))


def generation_spans(tree: PrefixTree) -> Iterator[tuple[Node, int, int, list[int]]]:
    """Every span ``[a, b)`` of a node that the same rollouts generated, with those
    rollouts (sorted): a call generates every position of its path at depth >= its prompt
    length. Positions of no call's completion are in no span."""
    # Walk up from each call's end over its completion only (linear).
    starts: dict[Node, list[tuple[int, int]]] = defaultdict(list)
    for c in tree.calls:
        n: Node | None = c.node
        while n is not None and n is not tree.root and n.end > c.prompt_len:
            starts[n].append((max(0, c.prompt_len - n.start), c.rollout))
            n = n.parent
    for node, events in starts.items():
        events.sort()
        seen: set[int] = set()
        for j, (off, r) in enumerate(events):
            seen.add(r)
            nxt = events[j + 1][0] if j + 1 < len(events) else len(node)
            if nxt > off:  # else more rollouts start at this same offset
                yield node, off, nxt, sorted(seen)


def assign_weights(
    tree: PrefixTree,
    *,
    mode: str,
    normalise_std: bool = False,
    advantages: list[float] | None = None,
) -> list[float]:
    """Set ``node.weight`` for every position of the tree; returns the rollouts'
    advantages (computed from their rewards unless given). ``mode``: a name in
    :data:`ADVANTAGE_MODES`."""
    weigh = ADVANTAGE_MODES.lookup(mode)(tree)
    if advantages is None:
        advantages = group_advantages(
            [r.reward for r in tree.rollouts], normalise_std=normalise_std
        )
    adv = np.asarray(advantages, dtype=np.float64)
    for node in tree.nodes():
        node.weight[:] = 0.0
        node.owner[:] = -1
    for node, a, b, rs in generation_spans(tree):
        node.weight[a:b] = weigh(node, rs, adv)
        node.owner[a:b] = rs[0]
    for node in tree.nodes():
        node.weight[~node.generated] = 0.0
        node.owner[~node.generated] = -1
    return [float(a) for a in adv]


AVERAGES = ("token", "execution_then_batch")  # train.average, the default first


def set_scale(tree: PrefixTree, average: str, fresh_from: int | None = None) -> None:
    """Set ``node.scale`` for ``train.average``: 1 everywhere for ``token``; for
    ``execution_then_batch``, at a position the rollouts ``R(p)`` generated,
    ``sum(1 / n_r for r in R(p))`` where ``n_r`` counts the positions ``r`` generated that a
    step trains (``generated & taken``, of version >= ``fresh_from``; None: every version).
    The scales of the trained positions then sum to the number of rollouts with a trained
    position, so dividing the scaled loss by that sum averages per rollout, then over them.
    Call it after anything that changes ``taken``."""
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {', '.join(AVERAGES)}, got {average!r}")
    for node in tree.nodes():
        node.scale[:] = 1.0
    if average == "token":
        return
    spans = list(generation_spans(tree))
    trained = np.zeros(len(tree.rollouts), dtype=np.float64)
    for node, a, b, rs in spans:
        keep = node.generated[a:b] & node.taken[a:b]
        if fresh_from is not None:
            keep &= node.version[a:b] >= fresh_from
        trained[rs] += int(keep.sum())
    inverse = np.divide(1.0, trained, out=np.zeros_like(trained), where=trained > 0)
    for node, a, b, rs in spans:
        node.scale[a:b] = float(inverse[rs].sum())


@dataclass(frozen=True, slots=True)
class Weighting:
    """How rewards become loss weights: the advantage mode, the std normalisation and the
    average (a run's are ``train.advantage_mode``, ``train.normalise_std`` and
    ``train.average``, ``TrainConfig.weighting``). The trainer weighs its trees with its
    config's ``weighting``, and the tree browser shows a run's trees weighed with the same
    (``gyre_core.config.run_weighting``)."""

    mode: str  # a name in ADVANTAGE_MODES
    normalise_std: bool
    average: str = "token"  # a name in AVERAGES

    def __post_init__(self) -> None:
        ADVANTAGE_MODES.lookup(self.mode)
        if self.average not in AVERAGES:
            raise ValueError(f"average must be one of {', '.join(AVERAGES)}, not {self.average!r}")

    def apply(self, tree: PrefixTree) -> list[float]:
        """``assign_weights`` with this mode and normalisation -> the rollouts' advantages."""
        return assign_weights(tree, mode=self.mode, normalise_std=self.normalise_std)

    def trees(self, rollouts: Iterable[Rollout], *, scaled: bool = True) -> dict[str, PrefixTree]:
        """One tree per group (``build_trees``) of its scored rollouts (infrastructure and
        evaluation failures are left out: ``gyre_core.trajectory.failures``), its loss
        weights set, and its scales unless ``scaled`` is False (every token counted fresh;
        the trainer passes False and sets them once, after path sampling: ``scale``)."""
        trees = build_trees(scored(rollouts))
        for tree in trees.values():
            self.apply(tree)
            if scaled:
                set_scale(tree, self.average)
        return trees

    def scale(self, trees: Iterable[PrefixTree], fresh_from: int | None = None) -> None:
        """``set_scale`` of every tree with this average, counting as trained only tokens
        of version >= ``fresh_from``."""
        for tree in trees:
            set_scale(tree, self.average, fresh_from)


def _branches_through(tree: PrefixTree) -> dict[Node, dict[int, int]]:
    """For every node, per rollout, how many of that rollout's branches pass through it."""
    counts: dict[Node, dict[int, int]] = {}
    for r, ends in branch_ends(tree).items():
        for e in ends:
            n: Node | None = e
            while n is not None and n is not tree.root:
                d = counts.setdefault(n, {})
                d[r] = d.get(r, 0) + 1
                n = n.parent
    return counts
