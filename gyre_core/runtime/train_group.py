"""The run's trainer as the driver sees it: a group of training units it never holds.

The weights, gradients and AdamW state live in the processes of the units in the train
role (:class:`~gyre_core.train.member.TrainMember` in each, one
:class:`~gyre_core.train.sharded.ShardedTrainer` group across them). The driver holds the
membership, the policy version and the batches: it packs each step's samples, splits them
over the processes by tokens and sends each process its own share.

Membership changes when the loop switches a unit (:meth:`TrainGroup.join`,
:meth:`TrainGroup.leave`); a change waits for a running step and re-forms the group once
for every change queued meanwhile. Where the state comes from when the group forms again:
the processes that stay (a unit that joins receives it from a peer), or, when no unit kept
it, the offload the last ones wrote on leaving (a sharded checkpoint in the run folder), a
run checkpoint (resume) or the model folder (with a warm-start file).

A unit lost in a step (its process gone: Ray fails its call) has the other processes'
collectives aborted at once (``abort_group``) instead of waiting for the timeout; the
step raises :class:`UnitsLost` and runs again on the units left, which keep their state.
When every unit holding the state is lost, the group goes on from its last periodic
offload: each run checkpoint (``checkpoint_every`` steps) is also linked in the work
folder as one, so such a loss costs at most that many steps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from gyre_core.config import RunConfig
from gyre_core.runtime.plan import train_setup
from gyre_core.train.losses import count_fresh
from gyre_core.train.member import CHECKPOINT, INIT, KEEP, GroupSpec
from gyre_core.train.trainer import BatchPlan, shard_by_tokens
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.tree import PrefixTree

SETTLE_S = 0.05  # a change waits this long for the others queued with it
log = logging.getLogger(__name__)


@dataclass
class Source:
    """Where the state comes from when no process holds it: ``kind`` ``init`` (``path``:
    a full weights file, "" for the model folder's) or ``checkpoint`` (a sharded one)."""

    kind: str
    path: str = ""
    version: int = 0
    strict: bool = False  # a checkpoint of other trainer settings is refused (a resume)


class StateLost(RuntimeError):
    """The units holding the only copy of the training state were lost."""


class UnitsLost(Exception):
    """A step found units dead: they leave the pool, the step runs again."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


class TrainGroup:
    """See the module docstring. ``units`` are the run's unit slots (each with its
    ``procs``: one Ray actor per process); ``workdir`` holds the offload."""

    def __init__(self, cfg: RunConfig, workdir: Path, source: Source | None = None) -> None:
        self.cfg, self.config = cfg, cfg.train
        self.setup = train_setup(cfg)  # what each member's trainer takes of the config
        self.staleness_bound = cfg.scheduler.staleness_bound
        self.plan = BatchPlan(cfg.train, cfg.scheduler.staleness_bound, cfg.seed)
        self.source = source or Source(INIT)
        self.version = self.source.version
        self.offload = workdir / "offload"
        self.members: list[Any] = []  # the unit slots in the group, in its rank order
        self.wanted: dict[int, Any] = {}  # the membership asked for, by unit id
        self.lock = asyncio.Lock()
        self.reference = ""  # the KL reference's full weights file ("" for the model's)

    # ------------------------------------------------------------------ batches

    def weigh(self, rollouts: Iterable[Rollout], version: int) -> dict[str, PrefixTree]:
        return self.plan.weigh(rollouts, version)

    def prepare(
        self,
        rollouts: Iterable[Rollout],
        version: int,
        trees: dict[str, PrefixTree] | None = None,
    ) -> list[PackedSample]:
        return self.plan.prepare(rollouts, version, trees)

    # ------------------------------------------------------------------ membership

    async def attach(self, slots: Sequence[Any]) -> dict[str, float]:
        """The run's units, once, before any change: a group formed by its changes needs
        nothing here (a streaming one forms its world: runtime/stream_group.py)."""
        return {}

    async def set_reference(self, path: str) -> None:
        """The KL reference's full weights file, for the groups formed from now on."""
        self.reference = path

    async def join(self, slot: Any) -> dict[str, float]:
        self.wanted[slot.id] = slot
        return await self._settle()

    async def leave(self, slot: Any) -> dict[str, float]:
        self.wanted.pop(slot.id, None)
        return await self._settle()

    async def resize(self, slots: Sequence[Any]) -> dict[str, float]:
        self.wanted = {s.id: s for s in slots}
        return await self._settle()

    async def _settle(self) -> dict[str, float]:
        """Apply ``wanted`` once the lock is free; ``group_wait_s``: how long the change
        waited for it (a step, a weight gather or a checkpoint of the group holding it)."""
        await asyncio.sleep(SETTLE_S)
        t = time.perf_counter()
        async with self.lock:
            waited = time.perf_counter() - t
            return {"group_wait_s": waited, **await self._reform()}

    async def _reform(self) -> dict[str, float]:
        """Form the group ``wanted`` asks for (the lock held); the seconds of its parts."""
        new = [s for _, s in sorted(self.wanted.items()) if not s.dead]
        if [s.id for s in new] == [s.id for s in self.members]:
            return {}
        old = [s for s in self.members if not s.dead]
        staying = [s for s in old if s.id in self.wanted]
        parts: dict[str, float] = {}
        if old and not staying:  # nobody keeps the state: the last ones write it out
            await self._offload(old)
            parts["offload_s"] = self.offload_s
            old = []
        leaving = [s for s in old if s not in staying]
        if not new:
            self.members = []
            await asyncio.gather(*(p.leave.remote() for s in leaving for p in s.procs))
            return parts
        if staying:  # a joining unit takes the state of the first that stays
            joins = any(s not in staying for s in new)
            replica = next(i for i, s in enumerate(new) if s in staying) if joins else -1
            source = Source(KEEP)
        else:
            if self.source.version != self.version:
                self._restore_lost(parts)
            replica, source = -1, self.source
        address, port = await new[0].procs[0].rendezvous.remote()
        key = f"gyre-{uuid.uuid4().hex}/"  # this formation's keys in the store
        per = self.cfg.cluster.gpus_per_unit
        specs = [
            GroupSpec(
                rank=u * per + j,
                units=len(new),
                per_unit=per,
                address=address,
                port=port,
                source=source.kind,
                replica=replica,
                path=source.path,
                version=self.version,
                strict=source.strict,
                key=key,
            )
            for u in range(len(new))
            for j in range(per)
        ]
        procs = [p for s in new for p in s.procs]
        outs = await asyncio.gather(
            *(
                p.form.remote(self.setup, self.reference, spec)
                for p, spec in zip(procs, specs, strict=True)
            ),
            *(p.leave.remote() for s in leaving for p in s.procs),
        )
        self.members = new
        for key in ("reform_s", "transfer_s", "restore_s"):
            parts[key] = max(o.get(key, 0.0) for o in outs[: len(procs)])
        return parts

    async def _offload(self, holders: list[Any]) -> None:
        """The holders write the state as a sharded checkpoint and leave the group."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if self.offload.exists():
            shutil.rmtree(self.offload)
        path, v = str(self.offload), self.version
        await asyncio.gather(*(p.leave.remote(path, v) for s in holders for p in s.procs))
        self.source = Source(CHECKPOINT, path, v)
        self.members = []
        self.offload_s = loop.time() - t0

    def _procs(self) -> list[Any]:
        if not self.members:
            raise RuntimeError("no unit is in the train role")
        return [p for s in self.members for p in s.procs]

    async def _all(self, calls: list[Any]) -> list[Any]:
        """Await one call per process; units found dead raise :class:`UnitsLost`. The first
        process found dead has the others' collectives aborted (``abort_group``, on their
        actors' own loop), so that they return at once instead of at the timeout."""
        procs = self._procs()
        tasks = [asyncio.ensure_future(c) for c in calls]
        pending: set[asyncio.Future[Any]] = set(tasks)
        aborted = False
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            if not aborted and any(_lost(t) for t in done):
                aborted = True
                gone = {id(p) for p, t in zip(procs, tasks, strict=True) if _lost(t)}
                await _abort([p for p in procs if id(p) not in gone])
        outs = [t.exception() or t.result() for t in tasks]
        dead = {
            s.name
            for s in self.members
            for p, x in zip(procs, outs, strict=True)
            if p in s.procs and isinstance(x, ray.exceptions.RayActorError)
        }
        if dead:
            raise UnitsLost(sorted(dead))
        for x in outs:
            if isinstance(x, ray.exceptions.RayTaskError) and isinstance(x.cause, ValueError):
                raise ValueError(str(x.cause)) from None  # a refusal, said by name
            if isinstance(x, BaseException):
                raise x
        return outs

    # ------------------------------------------------------------------ work

    async def step(
        self,
        samples: list[PackedSample],
        version: int,
        more: AsyncIterator[list[PackedSample]] | None = None,
    ) -> dict[str, float]:
        """One RL step of the group on ``samples`` (made at ``version``); a batch with no
        fresh token leaves the weights alone (``skipped``). The version advances. ``more``
        (micro-steps fed while the step runs) is a streaming group's alone."""
        if more is not None:
            raise ValueError("a sharded group trains whole batches: scheduler.streaming feeds")
        async with self.lock:
            await self._reform()  # units found dead since the last change have left
            total = count_fresh(samples, version, self.staleness_bound)
            if total == 0:
                self.version += 1  # the run moves on
                return self.plan.skipped(samples, version)
            procs = self._procs()
            shards = shard_by_tokens(samples, len(procs))
            rounds = max(len(x) for x in shards)
            outs = await self._all(
                [
                    p.train_step.remote(x, rounds, total, version)
                    for p, x in zip(procs, shards, strict=True)
                ]
            )
            self.version += 1
            out: dict[str, float] = outs[0]
            return {**out, "version": float(self.version)}

    async def sft(self, samples: list[PackedSample], lr: float) -> float:
        """One supervised step on ``samples`` at ``lr``; its mean loss."""
        targets = sum(int(s.trainable.sum()) for s in samples)
        if targets == 0:
            raise ValueError("a supervised step needs at least one target token")
        async with self.lock:
            procs = self._procs()
            shards = shard_by_tokens(samples, len(procs))
            rounds = max(len(x) for x in shards)
            outs = await self._all(
                [p.sft.remote(x, rounds, targets, lr) for p, x in zip(procs, shards, strict=True)]
            )
        return float(outs[0]["sft_loss"])

    async def call_all(self, method: str, *args: Any) -> list[Any]:
        """Every process's ``method(*args)`` at once (a collective of the group)."""
        async with self.lock:
            return await self._all([getattr(p, method).remote(*args) for p in self._procs()])

    async def weights(self, bucket_bytes: int = 0) -> list[Any]:
        """The full weights in Ray's object store, gathered by the group a bucket at a time
        (a collective; ``engine.bucket_mb`` each: no process holds the whole model): the
        buckets' references, in order, for the driver to pass on; the values never enter
        the driver (:func:`fetch_weights` joins them where a whole state is wanted).
        ``bucket_bytes``: another bucket size than the config's."""
        bucket = bucket_bytes or self.cfg.engine.bucket_mb * 1024 * 1024
        async with self.lock:
            outs = await self._all([p.gather.remote(bucket) for p in self._procs()])
        refs: list[Any] = outs[0]
        return refs

    async def save(self, path: Path) -> None:
        """A sharded checkpoint of the current state (written by every process). It is
        also the group's periodic offload (every ``checkpoint_every`` steps of a run): its
        files are linked into ``workdir/last-offload`` (the run's retention may delete the
        checkpoint), and a group whose every unit is lost continues from there."""
        await self.call_all("save", str(path), self.version)
        keep = self.offload.with_name("last-offload")
        await asyncio.to_thread(_link_tree, Path(path), keep)
        self.source = Source(CHECKPOINT, str(keep), self.version)

    def _restore_lost(self, parts: dict[str, float]) -> None:
        """Every unit holding the state was lost since the last offload: the group goes on
        from it (the steps since are lost, at most one interval; the version goes on, so
        no trained rollout looks newer than the weights), or refuses when there is none."""
        if self.source.kind != CHECKPOINT:
            raise StateLost(
                f"the units holding the training state (version {self.version}) were lost "
                "before any offload or checkpoint of it: resume the run from its start"
            )
        lost = self.version - self.source.version
        log.warning(
            "training state of version %d lost with its units; going on from the offload of "
            "version %d (%d steps lost)",
            self.version,
            self.source.version,
            lost,
        )
        self.source = Source(CHECKPOINT, self.source.path, self.version)
        parts["lost_steps"] = float(lost)

    # ------------------------------------------------------------------ warm start
    # (the WarmTarget protocol of runtime/warm_target.py, and what a run does after it)

    async def load_weights(self, path: Path) -> None:
        await self.call_all("load_weights", str(path))

    async def save_state(self, folder: Path) -> None:
        await self.call_all("save", str(folder), self.version)

    async def load_state(self, folder: Path) -> None:
        await self.call_all("load_state", str(folder))

    async def reset_optimizer(self) -> None:
        await self.call_all("reset_optimizer")

    async def write_weights(self, path: Path) -> None:
        """The full weights as one file (the first process writes it)."""
        await self.call_all("write_weights", str(path))


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` made a copy of the folder ``src`` by hard links (no bytes copied; copied
    where the two are on different file systems), replacing what ``dst`` held."""
    tmp = dst.with_name(f".{dst.name}-new")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=_link_or_copy)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.replace(dst)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _lost(task: asyncio.Future[Any]) -> bool:
    """Whether a call finished, failed because its process is gone."""
    if not task.done() or task.cancelled():
        return False
    return isinstance(task.exception(), ray.exceptions.RayActorError)


async def _abort(procs: list[Any]) -> None:
    """Abort the collectives of ``procs`` (those still alive: a lost one answers nothing)."""
    await asyncio.gather(*(p.abort_group.remote() for p in procs), return_exceptions=True)


def fetch_weights(refs: list[Any]) -> dict[str, Any]:
    """The whole state of :meth:`TrainGroup.weights`' buckets, fetched into this process
    (for tools and tests; a run never does this in its driver)."""
    return {k: v for chunk in ray.get(refs) for k, v in chunk.items()}


async def _ready(ref: Any) -> None:
    """Wait for ``ref``'s task without fetching its value into this process."""
    await asyncio.to_thread(ray.wait, [ref], fetch_local=False)
