"""Summary figures of a trajectory log: how much the prefix trees deduplicate."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from gyre_core.trajectory.tree import PrefixTree


def tree_stats(trees: Iterable[PrefixTree]) -> dict[str, Any]:
    """The JSON keys of ``gyre traj stats`` (see docs/trajectory-format.md)."""
    rollouts = calls = per_call = per_branch = unique = trainable = nodes = longest = 0
    groups = 0
    kinds: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for t in trees:
        groups += 1
        rollouts += len(t.rollouts)
        calls += len(t.calls)
        statuses.update(r.status for r in t.rollouts)
        kinds.update(c.kind for c in t.calls)
        per_call += sum(c.full_len for c in t.calls)
        for n in t.nodes():
            nodes += 1
            unique += len(n)
            trainable += int(n.generated.sum())
            if not n.children:
                per_branch += n.end
                longest = max(longest, n.end)
    return {
        "rollouts": rollouts,
        "groups": groups,
        "calls": calls,
        "tokens_per_call": per_call,
        "tokens_per_branch": per_branch,
        "tokens_unique": unique,
        "trainable_tokens_unique": trainable,
        "dedup_vs_call": round(per_call / unique, 4) if unique else 0.0,
        "dedup_vs_branch": round(per_branch / unique, 4) if unique else 0.0,
        "calls_by_kind": dict(sorted(kinds.items())),
        "rollouts_by_status": dict(sorted(statuses.items())),
        "nodes": nodes,
        "longest_path": longest,
    }
