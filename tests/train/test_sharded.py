"""Hybrid sharding for real: processes joined by gloo, one training unit a shard group of
FSDP2 processes, units replicating each other. Two steps on a fixed batch give the same
parameters with 1 unit x 1 process, 1 unit x 2 processes and 2 units x 2 processes as the
plain single-process trainer, within 1e-5 relative; so does a step, a sharded checkpoint
written by 2 x 2 processes, and a step after it resumed on 1 x 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gyre_core.train.config import TrainConfig
from gyre_core.train.sharded import ShardedTrainer, decoder_layers, mixed_precision, unit_mesh
from tests.train.test_trainer import make_trainer, sample_rollouts, tiny_model
from tests.train.world import join_world, world_port

STEPS = 2


def _batch() -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=3, group_size=4, length=6, seed=7)


def _one_sample_batch() -> list:  # type: ignore[type-arg]
    """One group that packs into one sample: every process but one pads its microbatch."""
    return sample_rollouts(tiny_model(seed=1), groups=1, group_size=2, length=6, seed=7)


def _kl_trainer() -> Any:
    return make_trainer(tiny_model(), TrainConfig(kl_coef=0.1), tiny_model(seed=3))


def _process(rank: int, world: int, units: int, port: int, out: str, ckpt: str, mode: str) -> None:
    """``mode``: ``steps`` (STEPS steps), ``save`` (one step, then a checkpoint in
    ``ckpt``) or ``resume`` (load ``ckpt``, then one step)."""
    torch.set_num_threads(1)
    join_world(rank, world, port)
    try:
        plain = _kl_trainer() if mode == "kl" else make_trainer(tiny_model())
        trainer = ShardedTrainer(plain, unit_mesh(units, world // units))
        shapes = {n: tuple(p.to_local().shape) for n, p in trainer.trainer.params}
        if mode == "resume":
            trainer.load(Path(ckpt))
        steps = STEPS if mode in ("steps", "kl") else 1
        batch = _one_sample_batch() if mode == "kl" else _batch()
        metrics = [trainer.step(batch) for _ in range(steps)]
        if mode == "save":
            trainer.save(Path(ckpt))
        full = trainer.full_state_dict()
        if rank == 0:
            torch.save({"params": full, "metrics": metrics, "shapes": shapes}, out)
        dist.barrier()  # no process tears its connections down while a peer still works
    finally:
        dist.destroy_process_group()


def _sharded(tmp_path: Path, units: int, per_unit: int, mode: str = "steps") -> dict:  # type: ignore[type-arg]
    out = tmp_path / f"{units}x{per_unit}-{mode}.pt"
    world = units * per_unit
    with world_port() as port:
        args = (world, units, port, str(out), str(tmp_path / "ckpt"), mode)
        mp.spawn(_process, args=args, nprocs=world, join=True)
    return torch.load(out)  # type: ignore[no-any-return]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def test_one_step_is_the_same_at_every_width(tmp_path) -> None:
    plain = make_trainer(tiny_model())
    want_metrics = [plain.step(_batch()) for _ in range(STEPS)]
    want = {n: p.detach().clone() for n, p in plain.model.named_parameters()}
    for units, per_unit in ((1, 1), (1, 2), (2, 2)):
        got = _sharded(tmp_path, units, per_unit)
        worst = max(_relative(got["params"][n], w) for n, w in want.items())
        assert worst < 1e-5, f"{units}x{per_unit}: parameters differ by {worst:.2e} relative"
        for g, w in zip(got["metrics"], want_metrics, strict=True):
            assert g["version"] == w["version"] and g["tokens"] == w["tokens"]
            assert g["loss"] == pytest.approx(w["loss"], rel=1e-5, abs=1e-7)
            assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5)
        if per_unit == 2:  # each process holds half of a sharded parameter's rows
            name = "model.layers.0.mlp.up_proj.weight"
            assert got["shapes"][name][0] * 2 == want[name].shape[0]
    assert got["params"]["model.layers.0.mlp.up_proj.weight"].dtype == torch.float32


def test_a_process_with_no_sample_runs_the_kl_reference_too(tmp_path) -> None:
    """With a KL reference, a process that pads its microbatch (one sample, two processes)
    gathers the reference's shards as its peer does: the step runs and equals the plain
    trainer's (before, gloo failed: "Received data size doesn't match expected size")."""
    plain = _kl_trainer()
    want_metrics = [plain.step(_one_sample_batch()) for _ in range(STEPS)]
    want = {n: p.detach().clone() for n, p in plain.model.named_parameters()}
    got = _sharded(tmp_path, 1, 2, mode="kl")
    worst = max(_relative(got["params"][n], w) for n, w in want.items())
    assert worst < 1e-5, f"parameters differ by {worst:.2e} relative"
    assert [g["kl"] for g in got["metrics"]] == pytest.approx(
        [w["kl"] for w in want_metrics], rel=1e-5, abs=1e-8
    )


def test_the_model_shards_layer_by_layer_and_precisions_are_named() -> None:
    assert len(decoder_layers(tiny_model())) == 2
    assert mixed_precision("bf16").param_dtype == torch.bfloat16
    assert mixed_precision("bf16").reduce_dtype == torch.float32
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        mixed_precision("fp16")


def test_a_sharded_checkpoint_resumes_at_another_width(tmp_path) -> None:
    plain = make_trainer(tiny_model())
    for _ in range(STEPS):
        plain.step(_batch())
    _sharded(tmp_path, 2, 2, "save")  # 4 processes write their shards after step 1
    got = _sharded(tmp_path, 1, 2, "resume")  # 2 processes read them and take step 2
    worst = max(_relative(got["params"][n], p.detach()) for n, p in plain.model.named_parameters())
    assert worst < 1e-5 and got["metrics"][0]["version"] == STEPS
