"""A training group of real processes without Ray: each spawned process runs one
:class:`~gyre_core.train.member.TrainMember`, and follows the same script of formations and
steps (what :class:`~gyre_core.runtime.train_group.TrainGroup` sends them on a run). Used
by the member tests and ``benchmarks/switch_memory.py``."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from torch._C._distributed_c10d import TCPStore

from gyre_core.config import RunConfig
from gyre_core.runtime.plan import train_setup
from gyre_core.train.losses import count_fresh
from gyre_core.train.member import KEEP, TIMEOUT, GroupSpec, TrainMember
from gyre_core.train.trainer import BatchPlan, shard_by_tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Place:
    """One process's place in the run: its global index (``unit * per_unit + proc``) and
    the rendezvous port the first process's store listens on."""

    index: int
    per_unit: int
    port: int
    store: Any = None  # the store, on the process that opened it

    def open_store(self) -> None:
        if self.index == 0:
            self.store = TCPStore(
                "127.0.0.1", self.port, None, True, TIMEOUT, wait_for_workers=False
            )

    def spec(self, units: list[int], n: int, source: str = KEEP, **kw: Any) -> GroupSpec | None:
        """This process's spec in the ``n``-th formation, of units ``units`` (None when
        its unit is not among them); ranks follow the order of ``units``."""
        unit, proc = divmod(self.index, self.per_unit)
        if unit not in units:
            return None
        rank = units.index(unit) * self.per_unit + proc
        return GroupSpec(rank=rank, units=len(units), per_unit=self.per_unit, address="127.0.0.1",
                         port=self.port, source=source, key=f"form-{n}/", **kw)  # fmt: skip

    def form(self, member: TrainMember, spec: GroupSpec) -> dict[str, float]:
        store = self.store if spec.rank == 0 else None
        return member.form(spec, store)


def member_for(model_dir: str, kl_coef: float = 0.0) -> tuple[TrainMember, BatchPlan, int]:
    cfg = RunConfig.from_dict({"model": {"checkpoint": model_dir}, "train": {"kl_coef": kl_coef}})
    setup = train_setup(cfg)
    return (
        TrainMember(setup, model_dir),
        BatchPlan(cfg.train, setup.staleness_bound),
        setup.staleness_bound,
    )


def step(member: TrainMember, plan: BatchPlan, bound: int, rollouts: list[Any], version: int,
         rank: int, world: int) -> dict[str, float]:  # fmt: skip
    """This process's part of one RL step on ``rollouts`` (the whole batch, the same on
    every process), as the driver splits it."""
    samples = plan.prepare(rollouts, version)
    total = count_fresh(samples, version, bound)
    shards = shard_by_tokens(samples, world)
    return member.step(shards[rank], max(len(x) for x in shards), total, version)
