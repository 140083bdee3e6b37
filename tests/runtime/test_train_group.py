"""The run's training group on real Ray actors and real gloo groups: 2 units x 2 processes
(FSDP2 inside a unit, replicas across units), the driver holding no model.

A run whose training width goes 2 -> 1 -> 2 (the unit that comes back receives the state
from its peer over the re-formed group) ends with the same parameters as one that kept
width 2 and as the plain single-process trainer, within 1e-5 relative; so does one whose
last unit left (the state offloaded as a sharded checkpoint) as another unit came in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import ray
import torch

from gyre_core.config import RunConfig
from gyre_core.rollout.vllm_ext.gyre_weights import group_of
from gyre_core.runtime.plan import train_setup
from gyre_core.runtime.real_job import _make_units, release_units
from gyre_core.runtime.train_group import TrainGroup, fetch_weights
from gyre_core.train.trainer import Trainer
from tests.train.test_trainer import sample_rollouts, tiny_model

pytestmark = pytest.mark.slow
STEPS = 3


@pytest.fixture(scope="module")
def ray_cluster():
    from gyre_core.runtime.ray_backend import start_ray

    start_ray("", 2, 2, 128)  # 2 units x 2 processes: 4 gpu_unit
    yield
    ray.shutdown()


def _cfg(model_dir: Path) -> RunConfig:
    return RunConfig.from_dict(
        {"cluster": {"units": 2, "gpus_per_unit": 2}, "model": {"checkpoint": str(model_dir)}}
    )


def _batch(version: int) -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=3, group_size=4, length=6, seed=version,
                           version=version)  # fmt: skip


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


async def _run(cfg: RunConfig, workdir: Path, widths: list[list[int]]) -> tuple[dict, list]:  # type: ignore[type-arg]
    """A step at each width of ``widths`` (unit indices); the final weights, the parts."""
    slots = await _make_units(cfg, Path(cfg.model.checkpoint), workdir)
    group = TrainGroup(cfg, workdir)
    parts = []
    try:
        for units in widths:
            parts.append(await group.resize([slots[u] for u in units]))
            v = group.version
            metrics = await group.step(group.prepare(_batch(v), v), v)
            assert metrics["version"] == v + 1 and metrics["skipped"] == 0.0
        weights = fetch_weights(await group.weights())
        refs = await group.weights(bucket_bytes=4096)  # a bucket per layer or module
        buckets = ray.get(refs)
        assert len(buckets) > 3 and fetch_weights(refs).keys() == weights.keys()
        assert all(torch.equal(v, weights[k]) for b in buckets for k, v in b.items())
        layers = [{group_of(k) for k in b} for b in buckets]
        assert all(not a & b for i, a in enumerate(layers) for b in layers[i + 1 :])  # unsplit
    finally:
        release_units(slots)
    return weights, parts


def test_width_changes_and_offload_keep_the_same_run(ray_cluster, tmp_path) -> None:
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    cfg = _cfg(model_dir)
    plain = Trainer.for_run(tiny_model(), train_setup(cfg))
    for v in range(STEPS):
        plain.step(_batch(v))
    want = {n: p.detach() for n, p in plain.model.named_parameters()}

    runs = {
        "kept 2": [[0, 1]] * STEPS,
        "2 -> 1 -> 2": [[0, 1], [0], [0, 1]],
        "offloaded": [[0, 1], [1], [0]],  # unit 0 takes over what unit 1 offloaded
    }
    for name, widths in runs.items():
        got, parts = asyncio.run(_run(cfg, tmp_path / name.replace(" ", ""), widths))
        worst = max(_relative(got[n], w) for n, w in want.items())
        assert worst < 1e-5, f"{name}: parameters differ by {worst:.2e} relative"
        if name == "2 -> 1 -> 2":
            assert parts[2]["transfer_s"] > 0, "the returning unit took its peer's state"
        if name == "offloaded":
            assert parts[2]["offload_s"] > 0 and parts[2]["restore_s"] > 0
