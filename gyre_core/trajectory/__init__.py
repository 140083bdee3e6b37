"""The trajectory processor: logs -> shared-prefix trees -> size-bounded packed samples.

Pipeline: :func:`read_rollouts` (validated ``gyre.trajectory/v1``) ->
:func:`build_trees` (one compressed prefix tree per group) -> :func:`assign_weights`
(group-relative advantages as per-token loss weights) -> :func:`pack_trees`
(samples of at most ``max_tokens`` tokens with tree-attention structure). A run's
:class:`Weighting` (advantage mode, std normalisation) is what its trainer weighs with;
``gyre_core.trajectory.export`` makes what the tree browser shows, weighed the same way.
"""

from gyre_core.trajectory.format import (
    FORMAT,
    Call,
    Prefix,
    Rollout,
    TrajectoryFormatError,
    read_rollouts,
)
from gyre_core.trajectory.pack import pack_trees, tokens_cut
from gyre_core.trajectory.rewards import Weighting, assign_weights, group_advantages
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.tree import PrefixTree, build_trees
from gyre_core.trajectory.writer import write_rollouts

__all__ = [
    "FORMAT",
    "Call",
    "PackedSample",
    "Prefix",
    "PrefixTree",
    "Rollout",
    "TrajectoryFormatError",
    "Weighting",
    "assign_weights",
    "build_trees",
    "group_advantages",
    "pack_trees",
    "read_rollouts",
    "tokens_cut",
    "tree_stats",
    "write_rollouts",
]
