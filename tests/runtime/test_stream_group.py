"""``scheduler.streaming`` on real Ray actors: the run's world over 2 units (rank 0 the core
with the only AdamW state, rank 1 a weight-only satellite), formed once; role changes park
and unpark, nothing re-forms.

Three steps end with the plain single-process trainer's parameters (1e-5 relative) whether
the satellite trains from a step's start, never trains, or enters training while the core
is in its step and joins it (after the core's second micro-step: read from the claim store
itself), and when each step opens on its first four micro-steps and takes the rest as they
are fed (the groups that finish while it runs). The core's optimizer state goes to host memory when it leaves training and comes
back when it returns; the satellite never holds any. A checkpoint of the core, read by a
new world, gives its weights back exactly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from torch._C._distributed_c10d import PrefixStore, TCPStore

from gyre_core.config import RunConfig
from gyre_core.runtime.plan import train_setup
from gyre_core.runtime.real_job import _make_units, release_units
from gyre_core.runtime.stream_group import StreamGroup, prefix_targets
from gyre_core.runtime.train_group import Source, fetch_weights
from gyre_core.train.member import CHECKPOINT
from gyre_core.train.trainer import Trainer
from tests.train.test_trainer import sample_rollouts, tiny_model

pytestmark = pytest.mark.slow
GROUPS = 24  # micro-steps a step (max_tokens 64: a group each), enough to join in progress
FED = -1  # in a step's units: it opens on its first micro-steps, the rest fed as it runs


@pytest.fixture(scope="module")
def ray_cluster():
    from gyre_core.runtime.ray_backend import start_ray

    start_ray("", 2, 1, 128)
    yield
    ray.shutdown()


def _cfg(model_dir: Path) -> RunConfig:
    return RunConfig.from_dict(
        {
            "cluster": {"units": 2, "gpus_per_unit": 1},
            "model": {"checkpoint": str(model_dir)},
            "scheduler": {"streaming": True},
            "train": {"max_tokens": 64},
        }
    )


def _batch(version: int) -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=GROUPS, group_size=2, length=28,
                           seed=version, version=version)  # fmt: skip


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


async def _done(group: StreamGroup, step: int, at_least: int) -> int:
    """Wait until ``at_least`` micro-steps of ``step`` are done, read from the claim store."""
    address, port, prefix = group.store_at
    store = PrefixStore(prefix, TCPStore(address, port, None, False, timedelta(seconds=30)))
    while (done := int(store.add(f"stream/{step}/done", 0))) < at_least:
        await asyncio.sleep(0.001)
    return done


async def _chunks(samples: list[Any]) -> AsyncIterator[list[Any]]:
    """The micro-steps after a step's first four, four at a time, as groups that finish
    while it runs would come."""
    for i in range(4, len(samples), 4):
        await asyncio.sleep(0.05)
        yield samples[i : i + 4]


async def _run(cfg: RunConfig, workdir: Path, plan: list[tuple[list[int], list[int]]]) -> Any:
    """A step for each ``(units at its start, units entering while it runs)`` of ``plan``;
    the core leaves training after the first step and comes back. The final weights, each
    step's metrics, what each unit holds, and the weights a new world reads back from a
    checkpoint of the core."""
    slots = await _make_units(cfg, Path(cfg.model.checkpoint), workdir)
    group = StreamGroup(cfg, workdir)
    metrics, held, seen = [], [], []
    try:
        await group.attach(slots)
        for i, (units, late) in enumerate(plan):
            await group.resize([slots[u] for u in units if u != FED])
            v = group.version
            samples = group.prepare(_batch(v), v)
            if FED in units:  # the step opens on four micro-steps, the rest fed meanwhile
                step = group.step(samples[:4], v, _chunks(samples))
            else:
                step = group.step(samples, v)
            task = asyncio.ensure_future(step)
            for u in late:
                seen.append(await _done(group, i, 2))
                await group.join(slots[u])
            metrics.append(await task)
            held.append([await s.procs[0].stream_info.remote() for s in slots])
            if i == 0:
                await group.resize([])  # the core serves rollouts: its state to the host
                held.append([await s.procs[0].stream_info.remote() for s in slots])
        weights = fetch_weights(await group.weights())
        await group.save(workdir / "ckpt")
    finally:
        release_units(slots)
    slots = await _make_units(cfg, Path(cfg.model.checkpoint), workdir / "again")
    again = StreamGroup(cfg, workdir / "again", Source(CHECKPOINT, str(workdir / "ckpt"), 3))
    try:
        await again.attach(slots)
        back = fetch_weights(await again.weights())
    finally:
        release_units(slots)
    return weights, metrics, held, seen, back


def test_streaming_steps_equal_the_plain_trainer_whoever_joins(ray_cluster, tmp_path) -> None:
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    cfg = _cfg(model_dir)
    plain = Trainer.for_run(tiny_model(), train_setup(cfg))
    for v in range(3):
        plain.step(_batch(v))
    want = {n: p.detach() for n, p in plain.model.named_parameters()}
    runs: dict[str, list[tuple[list[int], list[int]]]] = {
        "satellite from the start": [([0, 1], [])] * 3,
        "core alone": [([0], [])] * 3,
        "joins in progress": [([0], [1]), ([0, 1], []), ([0], [1])],
        "fed as it runs": [([0, 1, FED], []), ([0, FED], [1]), ([0, FED], [])],
    }
    for name, plan in runs.items():
        t0 = time.perf_counter()
        got, metrics, held, seen, back = asyncio.run(_run(cfg, tmp_path / name[:5], plan))
        worst = max(_relative(got[n], w) for n, w in want.items())
        assert worst < 1e-5, f"{name}: parameters differ by {worst:.2e} relative"
        assert all(torch.equal(back[k], v) for k, v in got.items()), "checkpoint round trip"
        members = [m["stream_members"] for m in metrics]
        width = [float(len([x for x in u if x != FED]) + len(late)) for u, late in plan]
        assert members == width, (name, members)
        assert all(m["stream_micro_steps"] == GROUPS for m in metrics)
        assert [m["version"] for m in metrics] == [1.0, 2.0, 3.0]
        core, sat = zip(*((h[0], h[1]) for h in held), strict=True)
        assert all(s["optimizer_state"] == 0 and s["host_state"] == 0 for s in sat)
        assert core[0]["optimizer_state"] > 0  # it trains in place
        assert core[1]["optimizer_state"] == 0 and core[1]["host_state"] > 0  # parked
        assert core[2]["optimizer_state"] == core[0]["optimizer_state"]  # back in place
        if name == "joins in progress":  # entered after two micro-steps, before the end
            assert all(2 <= d < GROUPS for d in seen), seen
            assert [m["stream_joined"] for m in metrics] == [1.0, 1.0, 1.0]
            assert metrics[0]["stream_core_micro_steps"] < GROUPS  # some left to the satellite
        print(f"{name}: {time.perf_counter() - t0:.1f} s, worst {worst:.1e}")


def test_the_units_that_train_are_a_prefix_of_the_ranks() -> None:
    now = ["rollout", "rollout", "train", "rollout"]
    # the policy moves unit 3 into training and unit 2 out: the prefix keeps the count
    assert prefix_targets({3: "train", 2: "rollout"}, now) == {0: "train", 2: "rollout"}
    assert prefix_targets({3: "train"}, now) == {0: "train", 1: "train", 2: "rollout"}
    assert prefix_targets({2: "idle"}, now) == {2: "idle"}
    assert prefix_targets({}, ["train", "rollout"]) == {}
