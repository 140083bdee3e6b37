"""Lost training units on real Ray actors and gloo groups, 3 units of 1 process.

Units 0 and 1 train a step, and a run checkpoint is written (the group's periodic offload).
Unit 1's process then freezes (SIGSTOP: its connections stay open, so nothing tells unit 0)
while unit 0 is inside a step's collective: ``abort_group``, on the actor's own loop, is
answered meanwhile and ends the blocked step with an error within a few seconds (not at the
collective timeout). Unit 1 is then gone, the group goes on with unit 0 (its state kept),
and when unit 0 is lost too, unit 2 takes the state of the periodic offload: one step lost,
the version going on."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import ray
import torch

from gyre_core.config import RunConfig
from gyre_core.runtime.real_job import _make_units, release_units
from gyre_core.runtime.train_group import TrainGroup, fetch_weights
from gyre_core.train.losses import count_fresh
from gyre_core.train.sharded_checkpoint import read_checkpoint
from tests.train.test_trainer import sample_rollouts, tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    from gyre_core.runtime.ray_backend import start_ray

    start_ray("", 3, 1, 128)
    yield
    ray.shutdown()


def _batch(version: int) -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=2, group_size=4, length=6, seed=version,
                           version=version)  # fmt: skip


async def _scenario(cfg: RunConfig, work: Path) -> dict[str, float]:
    slots = await _make_units(cfg, Path(cfg.model.checkpoint), work)
    group = TrainGroup(cfg, work)
    try:
        await group.resize(slots[:2])
        await group.step(group.prepare(_batch(0), 0), 0)
        await group.save(work / "ckpt-1")  # a run checkpoint: the periodic offload
        offload = read_checkpoint(work / "ckpt-1")["model"]
        pid = await slots[1].actor.pid.remote()
        os.kill(pid, signal.SIGSTOP)
        samples = group.prepare(_batch(1), 1)
        total = count_fresh(samples, 1, group.staleness_bound)
        blocked = slots[0].actor.train_step.remote(samples[:1], 1, total, 1)
        await asyncio.sleep(3.0)  # unit 0 waits in the step's first collective
        t0 = time.monotonic()
        await asyncio.wait_for(slots[0].actor.abort_group.remote(), 10)
        with pytest.raises(ray.exceptions.RayTaskError):
            await asyncio.wait_for(blocked, 30)
        returned = time.monotonic() - t0
        os.kill(pid, signal.SIGKILL)
        slots[1].dead = True
        await group.resize(slots[:2])  # unit 0 alone, its state kept
        await group.step(group.prepare(_batch(1), 1), 1)
        kept_version = group.version
        ray.kill(slots[0].actor)
        slots[0].dead = True
        parts = await group.resize([slots[2]])  # the state's only holder is gone
        restored = fetch_weights(await group.weights())
        same = all(torch.equal(restored[k], offload[k]) for k in offload)
        await group.step(group.prepare(_batch(2), 2), 2)
        return {"returned_s": returned, "lost_steps": parts.get("lost_steps", -1.0),
                "kept_version": kept_version, "version": group.version, "same": float(same)}  # fmt: skip
    finally:
        release_units(slots)


def test_a_frozen_peer_is_aborted_and_a_lost_state_comes_back_from_the_offload(
    ray_cluster, tmp_path
) -> None:
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    cfg = RunConfig.from_dict(
        {"cluster": {"units": 3, "gpus_per_unit": 1}, "model": {"checkpoint": str(model_dir)}}
    )
    got = asyncio.run(_scenario(cfg, tmp_path / "run"))
    assert got["returned_s"] < 5.0, f"the blocked step ended {got['returned_s']:.1f} s after"
    assert got["kept_version"] == 2 and got["lost_steps"] == 1.0, got
    assert got["same"] == 1.0, "unit 2 did not start from the offload's weights"
    assert got["version"] == 3, "the version goes on after the loss"
