"""Which rollouts a step trains on, and per step the rollouts and tokens it left out, by cause.

A rollout of status ``failed`` records what failed (``Rollout.failure``, one of
:data:`~gyre_core.trajectory.format.FAILURES`; ``""`` when the log does not say, read as
the agent's). What failed decides whether the rollout is *scored* (its reward counts in its
group's mean and standard deviation and its tokens are trained) or left out:

* ``environment`` or ``engine`` failed: infrastructure, not the policy: left out
  (``excluded_environment``, ``excluded_engine``) — never a fake zero in its group;
* the agent failed before its first call (``agent`` or unknown, no call): nothing of the
  policy to score or train: left out (``excluded_agent``);
* its evaluation failed every try (``rollout.eval_retries``): its reward is unknown:
  dropped (``dropped_evaluation``).

A rollout that completed (a 0 included), timed out (it keeps the credit it reached) or
whose agent failed after some calls is scored. A left-out rollout never enters its group's
tree (:meth:`~gyre_core.trajectory.rewards.Weighting.trees`), so a group left with fewer
than two scored rollouts trains nothing (``groups_untrained``: its advantages are 0, or it
has no tree at all). Two more per-step figures come from packing: ``empty_trees`` (groups
whose scored rollouts made no call: nothing to pack) and ``tokens_cut`` (positions deeper
than ``train.max_tokens``, left out of the samples: :mod:`~gyre_core.trajectory.pack`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.pack import tokens_cut
from gyre_core.trajectory.tree import PrefixTree

# The per-step figures, in the order they are reported.
CAUSES = ("excluded_environment", "excluded_engine", "excluded_agent", "dropped_evaluation")
FIGURES = (*CAUSES, "groups_untrained", "empty_trees", "tokens_cut")


def left_out(r: Rollout) -> str:
    """Why ``r`` is not scored (one of :data:`CAUSES`), or ``""`` for a scored rollout."""
    if r.status != "failed":
        return ""
    if r.failure in ("environment", "engine"):
        return f"excluded_{r.failure}"
    if r.failure == "evaluation":
        return "dropped_evaluation"
    return "" if r.calls else "excluded_agent"


def scored(rollouts: Iterable[Rollout]) -> list[Rollout]:
    """The rollouts a step scores and trains: every one :func:`left_out` keeps."""
    return [r for r in rollouts if not left_out(r)]


def step_figures(
    batch: Iterable[Rollout], trees: Mapping[str, PrefixTree], max_tokens: int
) -> dict[str, float]:
    """A step's rollouts left out by cause, its groups that train nothing, its trees with
    nothing to pack and its positions cut at ``max_tokens``. ``trees``: what the step
    built of ``batch`` (one per group with a scored rollout)."""
    rollouts = list(batch)
    out: Counter[str] = Counter({k: 0 for k in FIGURES})
    out.update(left_out(r) for r in rollouts if left_out(r))
    for gid in dict.fromkeys(r.group_id for r in rollouts):
        tree = trees.get(gid)
        if tree is None or len(tree.rollouts) < 2:
            out["groups_untrained"] += 1
        if tree is not None and not tree.calls:
            out["empty_trees"] += 1
    out["tokens_cut"] = sum(tokens_cut(t, max_tokens) for t in trees.values())
    return {k: float(out[k]) for k in FIGURES}


__all__ = ["CAUSES", "FIGURES", "left_out", "scored", "step_figures"]
