"""A step's weights over NCCL (``engine.weight_sync: nccl``, CUDA only): the loop's side.

The training group's first process is rank 0 of one broadcast group with every worker of
every live rollout unit's vLLM server (:func:`~gyre_core.rollout.nccl_sync.layout`). The
group is formed with the first update and again whenever the training group or the set
of live rollout units changes, or a unit's server started or woke (its server has not
joined), or an update failed. An update is one call to every process of the training
group (``UnitActor.send_weights``: each gathers every weight, the first casts it on its
GPU and broadcasts it) and one to every rollout unit (``UnitActor.receive_weights``: paused,
one ``/update_weights`` per bucket, the version tagged and read back), all at once. Nothing
goes through Ray's object store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gyre_core.rollout.nccl_sync import layout, nccl_init_body


class NcclPublisher:
    """The NCCL weight group of a run and its updates (module docstring)."""

    def __init__(self, trainer: Any, bucket_bytes: int) -> None:
        self.trainer, self.bucket_bytes = trainer, bucket_bytes
        self.key: tuple[Any, ...] | None = None  # whom the current group joined
        self.plan: Any = None  # every update's plan (Plan.to_wire), from the group's forming

    def reset(self) -> None:
        """The group is formed again with the next update."""
        self.key, self.plan = None, None

    async def publish(self, live: Sequence[Any], version: int) -> list[Any]:
        """Version ``version`` to the rollout units ``live`` (UnitSlots): each unit's
        outcome (None, or the exception it raised), in order. A failure of the training
        group's side raises."""
        if not live:
            return []
        key = (tuple(s.id for s in self.trainer.members), tuple(s.name for s in live))
        inits: list[Any] = [None] * len(live)
        if key != self.key:
            self.reset()
            workers = await asyncio.gather(*(s.actor.weight_ranks.remote() for s in live))
            offsets, world = layout([int(w) for w in workers])
            outs = await self.trainer.call_all("open_weights", world, self.bucket_bytes)
            uid, self.plan = outs[0]
            inits = [nccl_init_body(uid, o, world) for o in offsets]
            self.key = key
        sent, *results = await asyncio.gather(
            self.trainer.call_all("send_weights", self.plan),
            *(
                s.actor.receive_weights.remote(self.plan, version, init)
                for s, init in zip(live, inits, strict=True)
            ),
            return_exceptions=True,
        )
        if isinstance(sent, BaseException) or any(isinstance(r, BaseException) for r in results):
            self.reset()  # a rank may have left the group half-way: form it anew
        if isinstance(sent, BaseException):
            raise sent
        return list(results)
