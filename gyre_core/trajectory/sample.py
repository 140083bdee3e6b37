"""A packed training sample: one or more (sub)trees laid out in depth-first preorder.

Token ``i`` attends exactly to its ancestors on its own path (and itself). Because the
layout is preorder, every token's descendants occupy the contiguous index range
``[i, subtree_end[i])``, so the tree attention mask is
``mask[q, k] = k <= q < subtree_end[k]`` — one comparison, dense or block-sparse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

_UNSET_F = np.empty(0, dtype=np.float64)  # PackedSample.scale not given
_UNSET_I = np.empty(0, dtype=np.int64)  # PackedSample.rollout not given


@dataclass(slots=True)
class PackedSample:
    group_ids: list[str]  # the groups whose tokens this sample holds
    group: npt.NDArray[np.int32]  # per token: index into group_ids
    input_ids: npt.NDArray[np.int64]
    position_ids: npt.NDArray[np.int64]  # depth of the token on its path (0 at a root)
    parent: npt.NDArray[np.int64]  # index of the previous token on its path, -1 at a root
    trainable: npt.NDArray[np.bool_]  # generated, and trained in this sample
    advantage: npt.NDArray[np.float64]  # loss weight; 0 where not trainable
    logprob: npt.NDArray[np.float64]  # behaviour log-prob; nan where not trainable
    version: npt.NDArray[np.int64]  # policy version that generated it; -1 where not trainable
    # train.average's factor of the token's loss (rewards.set_scale); not given: 1
    scale: npt.NDArray[np.float64] = field(default_factory=lambda: _UNSET_F)
    # index in its group's rollouts of the (lowest-indexed) rollout that generated it;
    # -1 where not trainable or unknown (not given: -1 everywhere)
    rollout: npt.NDArray[np.int64] = field(default_factory=lambda: _UNSET_I)

    def __post_init__(self) -> None:
        if self.scale is _UNSET_F:
            self.scale = np.ones(len(self.input_ids), dtype=np.float64)
        if self.rollout is _UNSET_I:
            self.rollout = np.full(len(self.input_ids), -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.input_ids)

    def sequences(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """For the tokens at ``index``, which sequence each is of, numbered 0.. in order of
        first appearance: a sequence is one rollout of one group (a GSPO sequence)."""
        pairs = np.stack([self.group[index].astype(np.int64), self.rollout[index]], axis=1)
        _, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first))  # number sequences by first appearance
        return rank[inverse.reshape(-1)].astype(np.int64)

    @property
    def subtree_end(self) -> npt.NDArray[np.int64]:
        return subtree_end(self.parent)

    def to_json(self) -> dict[str, Any]:
        t = self.trainable
        return {
            "group_ids": self.group_ids,
            "group": self.group.tolist(),
            "input_ids": self.input_ids.tolist(),
            "parent": self.parent.tolist(),
            "trainable": t.astype(np.int8).tolist(),
            "advantage": [
                round(a, 9) if k else 0.0 for a, k in zip(self.advantage.tolist(), t, strict=True)
            ],
            "logprob": [x if k else None for x, k in zip(self.logprob.tolist(), t, strict=True)],
            "version": [v if k else None for v, k in zip(self.version.tolist(), t, strict=True)],
            **self._extra_json(),
        }

    def _extra_json(self) -> dict[str, Any]:
        """``scale`` and ``rollout`` where they say something (a file without them reads
        as scale 1 and rollout unknown, as files written before them do)."""
        t = self.trainable
        out: dict[str, Any] = {}
        if not np.all(self.scale[t] == 1.0):
            out["scale"] = [x if k else 1.0 for x, k in zip(self.scale.tolist(), t, strict=True)]
        if np.any(self.rollout[t] >= 0):
            out["rollout"] = [r if k else -1 for r, k in zip(self.rollout.tolist(), t, strict=True)]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PackedSample:
        parent = np.asarray(obj["parent"], dtype=np.int64)
        trainable = np.asarray(obj["trainable"], dtype=bool)
        logprob = np.asarray([np.nan if x is None else x for x in obj["logprob"]], dtype=np.float64)
        version = np.asarray([-1 if v is None else v for v in obj["version"]], dtype=np.int64)
        return cls(
            group_ids=list(obj["group_ids"]),
            group=np.asarray(obj["group"], dtype=np.int32),
            input_ids=np.asarray(obj["input_ids"], dtype=np.int64),
            position_ids=depths(parent),
            parent=parent,
            trainable=trainable,
            advantage=np.asarray(obj["advantage"], dtype=np.float64),
            logprob=logprob,
            version=version,
            scale=np.asarray(obj.get("scale", ()) or np.ones(len(parent)), dtype=np.float64),
            rollout=np.asarray(obj.get("rollout", ()) or np.full(len(parent), -1), dtype=np.int64),
        )


def subtree_end(parent: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For a preorder layout, one past the last index of each token's subtree."""
    n = len(parent)
    end = np.arange(1, n + 1, dtype=np.int64)
    for i in range(n - 1, -1, -1):  # children come after parents: fold ends upward
        p = parent[i]
        if p >= 0 and end[i] > end[p]:
            end[p] = end[i]
    return end


def depths(parent: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Depth of each token (its position id) from a preorder parent array."""
    d = np.zeros(len(parent), dtype=np.int64)
    for i, p in enumerate(parent.tolist()):
        if p >= 0:
            d[i] = d[p] + 1
    return d
