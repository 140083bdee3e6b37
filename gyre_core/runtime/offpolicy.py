"""Imported rollouts as off-policy RL data (``train.offpolicy_data``).

The file is a ``gyre.trajectory/v1`` file or an OpenAI message log
(:mod:`~gyre_core.rollout.chat_log`) whose generated tokens carry the log-probs of the
policy that sampled them. Each RL step adds ``train.offpolicy_groups`` of its groups to the
batch its own sessions played, cycling through the file; they are trained like the run's
own rollouts (one tree a group, the advantage relative to the group), and the loss corrects
for the policy that sampled them with its recorded log-probs (the importance ratio, clipped).

An imported token is stamped one version older than the step that trains it: never masked as
stale (``scheduler.staleness_bound`` >= 1 is required), and never taken for a token of the
current weights (``train.behaviour: trainer`` replaces only those log-probs). A message log
without log-probs trains only the supervised warm start (``warm_start.data``): it is
refused here, by conversation. A group of one rollout has advantage 0 and trains nothing, so
a file without a group of two or more is refused too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from gyre_core.rollout.chat_log import read_demonstrations
from gyre_core.trajectory.format import Rollout

FIELD = "train.offpolicy_data"


class OffPolicyError(ValueError):
    """An off-policy file that cannot train; the message names the field."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"{FIELD}: {problem}")
        self.field = FIELD


class OffPolicyData:
    """The groups of an imported file, handed out ``per_step`` at a time, in turn."""

    def __init__(self, rollouts: list[Rollout], per_step: int, name: str = "") -> None:
        groups: dict[str, list[Rollout]] = {}
        for r in rollouts:
            if r.extra.get("source") == "chat_log" and not r.extra.get("logprobs"):
                raise OffPolicyError(
                    f"{name}: conversation {r.rollout_id!r} has an assistant message without "
                    "logprobs: a log without log-probs trains only the warm start "
                    "(warm_start.data), not RL"
                )
            groups.setdefault(r.group_id, []).append(r)
        self.groups = [g for g in groups.values() if len(g) >= 2]
        if not self.groups:
            raise OffPolicyError(
                f"{name}: no group has two rollouts or more; advantages are relative to a "
                "group, so none would train (give conversations of one task the same group)"
            )
        self.per_step = per_step

    @classmethod
    def read(
        cls, path: Path, tokenizer: Any, per_step: int, template: str = "chatml"
    ) -> OffPolicyData:
        try:
            rollouts = read_demonstrations(path, tokenizer, template)
        except (OSError, ValueError) as e:
            raise OffPolicyError(str(e)) from None
        return cls(rollouts, per_step, str(path))

    def take(self, version: int) -> tuple[list[Rollout], list[Rollout]]:
        """The groups of the step that trains version ``version`` (the next ``per_step``
        after the earlier steps', so a resumed run or a step run again takes the same), with
        fresh ids (``x<version>.g<j>.<n>``; the file's in ``extra.source_id``): as the step
        trains them (every token stamped ``version - 1``) and as its books record them (the
        file's versions: a stamp of -1, before the first version, is not a version)."""
        train: list[Rollout] = []
        record: list[Rollout] = []
        for j in range(self.per_step):
            group = self.groups[(version * self.per_step + j) % len(self.groups)]
            gid = f"x{version}.g{j}"
            for n, r in enumerate(group):
                extra = {**r.extra, "offpolicy": True, "source_id": r.rollout_id}
                kept = replace(r, rollout_id=f"{gid}.{n}", group_id=gid, extra=extra)
                calls = [
                    replace(c, versions=np.full(len(c.completion_ids), version - 1, np.int64))
                    for c in r.calls
                ]
                record.append(kept)
                train.append(replace(kept, calls=calls))
        return train, record


def is_offpolicy(r: Rollout) -> bool:
    return bool(r.extra.get("offpolicy"))


__all__ = ["OffPolicyData", "OffPolicyError", "is_offpolicy"]
