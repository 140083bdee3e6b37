"""A deliberately naive reference: every position is the tuple of tokens leading to it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.format import full_sequences as format_full_sequences
from gyre_core.trajectory.rewards import group_advantages

Key = tuple[str, tuple[int, ...]]  # (group, tokens from the root up to and including this one)


@dataclass
class Pos:
    generated: bool = False
    logprob: float = 0.0
    version: int = -1
    gen_rollouts: set[int] = field(default_factory=set)


def full_sequences(r: Rollout) -> list[list[int]]:
    return [s.tolist() for s in format_full_sequences(r).values()]


class Naive:
    def __init__(self, rollouts: list[Rollout], normalise_std: bool = False) -> None:
        self.pos: dict[Key, Pos] = {}
        self.rollouts = rollouts
        self.seqs = [full_sequences(r) for r in rollouts]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(rollouts):
            groups[r.group_id].append(i)
        self.adv = [0.0] * len(rollouts)
        for idx in groups.values():
            for i, a in zip(
                idx,
                group_advantages([rollouts[i].score for i in idx], normalise_std=normalise_std),
                strict=False,
            ):
                self.adv[i] = a
        for i, (r, seqs) in enumerate(zip(rollouts, self.seqs, strict=True)):
            for c, seq in zip(r.calls, seqs, strict=True):
                for d in range(len(seq)):
                    p = self.pos.setdefault((r.group_id, tuple(seq[: d + 1])), Pos())
                    if d >= c.prompt_len:
                        j = d - c.prompt_len
                        if not p.generated:
                            p.generated, p.logprob, p.version = (
                                True,
                                float(c.logprobs[j]),
                                int(c.versions[j]),
                            )
                        p.gen_rollouts.add(i)

    @property
    def tokens_unique(self) -> int:
        return len(self.pos)

    @property
    def trainable(self) -> int:
        return sum(p.generated for p in self.pos.values())

    def leaves(self) -> list[Key]:
        parents = {(g, k[:-1]) for g, k in self.pos if len(k) > 1}
        return [key for key in self.pos if key not in parents]

    def branches(self, i: int) -> set[tuple[int, ...]]:
        seqs = {tuple(s) for s in self.seqs[i]}
        return {s for s in seqs if not any(len(o) > len(s) and o[: len(s)] == s for o in seqs)}

    def weight(self, key: Key, mode: str) -> float:
        p = self.pos[key]
        if not p.generated:
            return 0.0
        rs = sorted(p.gen_rollouts)
        if mode == "once":
            return float(np.mean([self.adv[r] for r in rs]))
        toks = key[1]
        return float(
            sum(
                self.adv[r] * sum(1 for b in self.branches(r) if b[: len(toks)] == toks) for r in rs
            )
        )
