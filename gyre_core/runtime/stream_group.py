"""The run's trainer under ``scheduler.streaming``: the paper's cells, a core and
weight-only satellites that claim a step's micro-steps, a late one joining in progress.

:class:`StreamGroup` is the :class:`~gyre_core.runtime.train_group.TrainGroup` the loop
holds when the run streams. Its world is formed once (:meth:`StreamGroup.attach`) over every
unit of the run, one process each (:mod:`gyre_core.train.stream_member`); after that a role
switch forms nothing: a unit that leaves training is parked (the core's AdamW state to
host memory), one that enters is unparked, and one that enters while a step runs serves
that step at once, joining it if its window is still open and every lower rank has joined
(the units that train are a prefix of the ranks: the loop gives the train role to the
lowest live ranks, core first). A step waits for no switch, and not for its whole
batch: it opens on the first groups the loop hands it and takes the others as the loop
feeds them (:meth:`StreamGroup.step`'s ``more``).

What it does not do yet: a unit lost mid-run ends the run (the world is not re-formed
around it; a resume continues from the last checkpoint).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gyre_core.cluster import ROLLOUT, TRAIN
from gyre_core.runtime.train_group import TrainGroup
from gyre_core.train.losses import count_fresh
from gyre_core.train.member import GroupSpec
from gyre_core.trajectory.sample import PackedSample

STREAM_DIR = "stream"  # the work folder's snapshots of each step (the core writes them)


class StreamGroup(TrainGroup):
    """See the module docstring; ``members`` are the units in the train role, in rank
    order, the core first."""

    def __init__(self, cfg: Any, workdir: Path, source: Any = None) -> None:
        super().__init__(cfg, workdir, source)
        self.folder = workdir / STREAM_DIR
        self.slots: list[Any] = []  # every unit of the run, in rank order (0: the core)
        self.led = 0  # the steps led so far: the next one's number in the claim store
        self.open: int | None = None  # the step in progress, which an entering unit serves
        self.late: list[asyncio.Future[Any]] = []  # serves of units that entered mid-step
        self.store_at: tuple[str, int, str] = ("", 0, "")  # the claims' store and prefix

    @property
    def core(self) -> Any:
        if not self.slots:
            raise RuntimeError("the streaming world is not formed (StreamGroup.attach)")
        return self.slots[0]

    async def attach(self, slots: Sequence[Any]) -> dict[str, float]:
        """Form the world over every unit of the run (once, at the run's start): the core
        takes the state the group's ``source`` names; every unit starts parked."""
        if any(len(s.procs) != 1 for s in slots):
            raise ValueError("scheduler.streaming needs cluster.gpus_per_unit 1")
        async with self.lock:
            self.slots = list(slots)
            await asyncio.to_thread(shutil.rmtree, self.folder, True)  # an earlier run's steps
            address, port = await self.core.procs[0].rendezvous.remote()
            key = f"gyre-{uuid.uuid4().hex}/"
            src = self.source
            specs = [
                GroupSpec(
                    rank=i,
                    units=len(slots),
                    per_unit=1,
                    address=address,
                    port=port,
                    source=src.kind,
                    path=src.path,
                    version=self.version,
                    strict=src.strict,
                    key=key,
                    stream=str(self.folder),
                )
                for i in range(len(slots))
            ]
            outs = await asyncio.gather(
                *(
                    s.procs[0].form.remote(self.setup, self.reference, spec)
                    for s, spec in zip(slots, specs, strict=True)
                )
            )
            self.store_at = (address, port, f"{key}stream/")
            self.members = []
            return {k: max(o[k] for o in outs) for k in ("reform_s", "restore_s")}

    async def set_reference(self, path: str) -> None:
        """The KL reference's weights file, loaded now by every unit of the world (formed
        once, it is not formed again to read it)."""
        self.reference = path
        await asyncio.gather(*(s.procs[0].stream_reference.remote(path) for s in self.slots))

    # ------------------------------------------------------------------ membership

    async def join(self, slot: Any) -> dict[str, float]:
        """``slot`` enters training; while a step runs it serves that step at once."""
        self.wanted[slot.id] = slot
        if self.open is None:
            return await self._settle()
        parts: dict[str, float] = await slot.procs[0].stream_unpark.remote()
        ids = {s.id for s in self.members} | {slot.id}
        self.members = [s for s in self.slots if s.id in ids]
        self.late.append(asyncio.ensure_future(slot.procs[0].stream_serve.remote(self.open)))
        return parts

    async def _reform(self) -> dict[str, float]:
        """Park the units that left the train role, unpark those that entered."""
        if not self.slots:
            raise RuntimeError("the streaming world is not formed (StreamGroup.attach)")
        lost = [s.name for s in self.slots if s.dead]
        if lost:
            raise RuntimeError(
                f"unit {', '.join(lost)} was lost: a streaming run does not continue without "
                "a unit yet; resume it from its last checkpoint"
            )
        new = [s for s in self.slots if s.id in self.wanted]
        if [s.id for s in new] == [s.id for s in self.members]:
            return {}
        had, has = {s.id for s in self.members}, {s.id for s in new}
        gone = [s for s in self.members if s.id not in has]
        come = [s for s in new if s.id not in had]
        outs = await asyncio.gather(
            *(s.procs[0].stream_park.remote() for s in gone),
            *(s.procs[0].stream_unpark.remote() for s in come),
        )
        self.members = new
        parts: dict[str, float] = {}
        for out in outs:
            for k, v in out.items():
                parts[k] = max(parts.get(k, 0.0), v)
        return parts

    # ------------------------------------------------------------------ work

    async def step(
        self,
        samples: list[PackedSample],
        version: int,
        more: AsyncIterator[list[PackedSample]] | None = None,
    ) -> dict[str, float]:
        """One streaming step made at ``version``: the core opens it on ``samples``, takes
        the micro-steps ``more`` yields while it runs (the groups that finish meanwhile),
        and updates once ``more`` ends; the satellites in the train role serve it, units
        entering meanwhile join it. ``stream_members``: how many took part."""
        async with self.lock:
            await self._reform()
            if more is None and count_fresh(samples, version, self.staleness_bound) == 0:
                self.version += 1
                return self.plan.skipped(samples, version)
            if self.core.id not in {s.id for s in self.members}:
                raise RuntimeError(
                    "scheduler.streaming: the core (the run's first unit, which holds the "
                    "optimizer state) is not in the train role"
                )
            step, self.led = self.led, self.led + 1
            core = self.core.procs[0]
            await core.stream_open.remote(step, samples, version)
            self.open = step
            try:
                finish = core.stream_finish.remote(step)
                sats = [s.procs[0].stream_serve.remote(step) for s in self.members[1:]]
                fed = list(samples)
                async for chunk in more or _nothing():
                    await core.stream_feed.remote(step, chunk)
                    fed += chunk
                await core.stream_seal.remote(step, count_fresh(fed, version, self.staleness_bound))
                out, *served = await asyncio.gather(finish, *sats)
            finally:
                self.open = None
            while self.late:
                served.append(await self.late.pop(0))
            self.version += 1
            figures = {
                "stream_members": out.pop("members"),  # ranks that took part, the core's too
                "stream_core_micro_steps": out.pop("claimed"),  # of the step's micro-steps
                "stream_micro_steps": float(len(fed)),
                "stream_joined": float(sum(1 for s in served if s["took"])),  # the core's peers
            }
            return {**out, **figures, "version": float(self.version)}

    async def sft(self, samples: list[PackedSample], lr: float) -> float:
        """A supervised step on the core alone."""
        targets = sum(int(s.trainable.sum()) for s in samples)
        if targets == 0:
            raise ValueError("a supervised step needs at least one target token")
        async with self.lock:
            out = await self.core.procs[0].sft.remote(samples, 1, targets, lr)
        return float(out["sft_loss"])

    async def call_all(self, method: str, *args: Any) -> list[Any]:
        """The core's ``method(*args)``: it alone holds the state (checkpoints, weight
        files, the optimizer's reset)."""
        async with self.lock:
            return [await getattr(self.core.procs[0], method).remote(*args)]

    async def weights(self, bucket_bytes: int = 0) -> list[Any]:
        """The core's weights in Ray's object store, a bucket at a time (no collective)."""
        bucket = bucket_bytes or self.cfg.engine.bucket_mb * 1024 * 1024
        async with self.lock:
            refs: list[Any] = await self.core.procs[0].gather.remote(bucket)
        return refs


def prefix_targets(targets: Mapping[int, str], current: Sequence[str]) -> dict[int, str]:
    """The policy's ``targets`` (role by unit) with as many units in training, moved to
    the lowest ranks: under streaming the units that train are a prefix of the ranks, core
    first. ``current``: each unit's target now; only the changes come back."""
    want = [targets.get(u, role) for u, role in enumerate(current)]
    n = sum(1 for role in want if role == TRAIN)
    out = {}
    for u, role in enumerate(want):
        role = TRAIN if u < n else (ROLLOUT if role == TRAIN else role)
        if role != current[u]:
            out[u] = role
    return out


async def _nothing() -> AsyncIterator[list[PackedSample]]:
    return
    yield  # an async generator that yields nothing
