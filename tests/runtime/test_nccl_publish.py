"""``engine.weight_sync: nccl``: the loop's publish takes the NCCL route (the training
group's processes open the group and send, every live rollout unit receives; nothing is
published through the object store; a unit's own start or wake reloads from disk), forms the group with the first update and again when
the units change or an update failed, and fails the step loudly. Real Ray actors stand in
for the units' processes (their NCCL side, gyre_core/rollout/nccl_sync.py, is tested over
gloo in tests/rollout/test_nccl_sync.py; NCCL itself needs CUDA)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from gyre_core.config import ConfigError, RunConfig
from gyre_core.rollout.engine_kinds import ENGINES
from gyre_core.rollout.nccl_sync import Plan
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_settings import VLLMSettings
from gyre_core.rollout.vllm_unit import VLLMUnit
from gyre_core.runtime.loop import Loop, PublishError
from gyre_core.runtime.ray_backend import UnitEngine
from tests.runtime.conftest import tiny_job
from tests.runtime.test_publish import loop_over
from tests.runtime.update_server import UpdateServer

UID = bytes(range(128))
PLAN = Plan(((("a.weight", "bfloat16", (2, 2)),), (("b.weight", "bfloat16", (4,)),))).to_wire()


@ray.remote(num_cpus=0)
class Proc:
    """A unit's process, as the loop calls it: the trainer's and the rollout unit's NCCL
    side (recorded), and the object-store publish, which this route must not call."""

    def __init__(
        self, rank: int = 0, workers: int = 1, refuse: bool = False, cuda: bool = True
    ) -> None:
        self.rank, self.workers, self.refuse, self.cuda = rank, workers, refuse, cuda
        self.calls: list[tuple[Any, ...]] = []

    async def publish(self, state: Any, version: int) -> None:
        raise AssertionError("the object-store route was taken")

    async def open_weights(self, world: int, bucket_bytes: int) -> Any:
        if not self.cuda:  # as UnitActor.open_weights refuses a trainer off CUDA
            raise RuntimeError("engine.weight_sync nccl needs CUDA; the trainer is on cpu")
        self.calls.append(("open", world, bucket_bytes))
        return (UID, PLAN) if self.rank == 0 else None

    async def send_weights(self, plan: Any) -> int:
        self.calls.append(("send", plan))
        return 1

    async def weight_ranks(self) -> int:
        return self.workers

    async def receive_weights(self, plan: Any, version: int, init: Any = None) -> None:
        if self.refuse:
            raise RuntimeError("POST /update_weights -> HTTP 500: the update failed")
        self.calls.append(("receive", plan, version, init))

    async def log(self) -> list[tuple[Any, ...]]:
        return list(self.calls)


def _loop(tmp_path: Path, rollout: list[Any], trainers: list[Any]) -> Loop:
    job = tiny_job()
    job["engine"] = {"weight_sync": "nccl", "bucket_mb": 3}
    return loop_over(tmp_path, rollout, job, trainers)


def test_nccl_publish_forms_the_group_once_and_sends_every_update_over_it(
    ray_cluster: None, tmp_path: Path
) -> None:
    wide, narrow = Proc.remote(workers=2), Proc.remote(workers=1)
    first, second = Proc.remote(rank=0), Proc.remote(rank=1)
    loop = _loop(tmp_path, [wide, narrow], [first, second])
    asyncio.run(loop._publish())
    assert loop.published == 3
    assert all(e.version == 3 for e in (loop.router.engine(f"unit-{i}") for i in (0, 1)))  # type: ignore[union-attr]
    # trainer rank 0, then unit-0's two workers, then unit-1's: a world of 4
    assert ray.get(first.log.remote()) == [("open", 4, 3 << 20), ("send", PLAN)]
    assert ray.get(second.log.remote()) == [("open", 4, 3 << 20), ("send", PLAN)]
    (got0,), (got1,) = ray.get(wide.log.remote()), ray.get(narrow.log.remote())
    assert got0[:3] == got1[:3] == ("receive", PLAN, 3)
    offsets = [g[3]["init_info"]["rank_offset"] for g in (got0, got1)]
    assert offsets == [1, 3] and got0[3]["init_info"]["world_size"] == 4
    loop.trainer.version = 4  # the next step: the group is reused, nothing is formed again
    asyncio.run(loop._publish())
    assert ray.get(first.log.remote())[2:] == [("send", PLAN)]
    assert ray.get(narrow.log.remote())[1] == ("receive", PLAN, 4, None)
    loop.units[0].dead = True  # the set of rollout units changed: a new group of 2 ranks
    loop.trainer.version = 5
    asyncio.run(loop._publish())
    assert ray.get(first.log.remote())[3:] == [("open", 2, 3 << 20), ("send", PLAN)]
    assert ray.get(narrow.log.remote())[2][3]["init_info"]["world_size"] == 2


def test_a_refused_nccl_update_fails_the_step_and_the_group_is_formed_anew(
    ray_cluster: None, tmp_path: Path
) -> None:
    good, bad, first = Proc.remote(), Proc.remote(refuse=True), Proc.remote(rank=0)
    loop = _loop(tmp_path, [good, bad], [first])
    loop.published = 2  # the engines serve version 2; the step trained 3
    with pytest.raises(PublishError, match=r"unit-1.*the update failed"):
        asyncio.run(loop._publish())
    assert loop.published == 2 and loop.nccl is not None and loop.nccl.key is None
    engine = loop.router.engine("unit-1")
    assert isinstance(engine, UnitEngine) and engine.version == 0


def test_a_failed_send_fails_the_step(ray_cluster: None, tmp_path: Path) -> None:
    """The training group's side refusing (as open_weights does without CUDA)."""
    loop = _loop(tmp_path, [Proc.remote()], [Proc.remote(rank=0, cuda=False)])
    loop.published = 2
    with pytest.raises(PublishError, match=r"over NCCL failed.*needs CUDA"):
        asyncio.run(loop._publish())
    assert loop.published == 2


def test_under_nccl_a_unit_s_own_publish_reloads_from_disk(tmp_path: Path) -> None:
    """A server that starts or wakes under ``nccl`` has vLLM's nccl receiver, not the IPC
    one or Gyre's bucket extension: its own publish writes a folder and reloads it."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    unit = VLLMUnit(0, base, tmp_path / "work", VLLMSettings(weight_sync="nccl"))
    assert not unit.streams  # the unit's actor joins the buckets into one state
    server = UpdateServer()
    try:
        unit.engine = VLLMEngine(server.url, version=1)
        asyncio.run(unit.publish({"w": torch.ones(2, 2)}, 2))
        rpcs = [b for p, b in server.posts if p == "/collective_rpc"]
        folder = tmp_path / "work" / "weights-v2"
        assert rpcs == [{"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}]
        assert (folder / "model.safetensors").is_file() and unit.engine.version == 2
    finally:
        server.close()


def test_nccl_is_refused_for_an_engine_without_vllm_s_receiver(tmp_path: Path) -> None:
    job = tiny_job()
    job["engine"] = {"weight_sync": "nccl"}
    cfg = RunConfig.from_dict(job)
    assert cfg.model.engine == "torch"
    with pytest.raises(ConfigError) as info:
        ENGINES[cfg.model.engine].settings(cfg, tmp_path, True)
    assert dict(info.value.errors) == {
        "engine.weight_sync": "nccl needs model.engine vllm, got torch"
    }
    assert ENGINES["torch"].settings(RunConfig.from_dict(tiny_job()), tmp_path, True) is None
