"""Streaming steps for real: two processes joined by gloo, the core (rank 0) with the
optimizer state, a weight-only satellite (rank 1) that claims micro-steps. Two steps on a
fixed batch end with the plain trainer's parameters (1e-5 relative) whether the satellite
never takes part, joins step 1 in progress, leaves after step 1, or works with the core on
steps opened on two micro-steps and fed the rest one at a time by another thread (as
groups finish); the core's AdamW state goes to host memory and back between the steps bit
for bit."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gyre_core.train.config import TrainConfig
from gyre_core.train.losses import count_fresh
from gyre_core.train.streaming import (
    StreamStep,
    offload_optimizer,
    prefix_groups,
    restore_optimizer,
)
from tests.train.test_sharded import _relative
from tests.train.test_trainer import make_trainer, sample_rollouts, tiny_model
from tests.train.world import join_world, world_port

STEPS = 2
SLOW_S = 0.15  # the core's pace a micro-step in ``join``: the satellite joins mid-step


def _batch() -> list:  # type: ignore[type-arg]
    """Six groups, each its own packed sample (a micro-step) under ``TRAIN``."""
    return sample_rollouts(tiny_model(seed=1), groups=6, group_size=2, length=28, seed=7)


def _trainer() -> Any:
    return make_trainer(tiny_model(), TrainConfig(max_tokens=64))


def _process(rank: int, port: int, folder: str, mode: str) -> None:
    torch.set_num_threads(1)
    store = join_world(rank, 2, port)  # the claims' keys beside the group's own
    try:
        groups = prefix_groups(2)
        trainer = _trainer()
        stream = StreamStep(trainer, store, groups, folder)
        if rank == 0:
            _core(trainer, stream, folder, mode)
        elif mode == "join":  # step 1 once the core did two micro-steps; step 2 at once
            took = [stream.serve(0, lambda done: done >= 2)]
            claimed = stream.claimed  # what it ran of step 1, joined in progress
            took.append(stream.serve(1))
            _satellite_report(trainer, folder, took, claimed)
        elif mode == "fed":  # both steps, from their start, as their micro-steps come
            took = [stream.serve(0), stream.serve(1)]
            _satellite_report(trainer, folder, took, stream.claimed)
        elif mode == "leave":  # step 1 only
            _satellite_report(trainer, folder, [stream.serve(0)], stream.claimed)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _core(trainer: Any, stream: StreamStep, folder: str, mode: str) -> None:
    if mode == "join":
        loss = trainer._sample_loss

        def slow(*args: Any) -> Any:
            time.sleep(SLOW_S)
            return loss(*args)

        trainer._sample_loss = slow
    metrics, exact = [], True
    for step in range(STEPS):
        samples = trainer.prepare(_batch(), trainer.version)
        metrics.append(_fed(trainer, stream, step, samples) if mode == "fed" else
                       stream.lead(step, samples))  # fmt: skip
        if step == 0:  # serve rollouts between the steps: the state to host and back
            before = {i: dict(s) for i, s in enumerate(trainer.optimizer.state.values())}
            host = offload_optimizer(trainer)
            empty = not trainer.optimizer.state
            restore_optimizer(trainer, host)
            after = list(trainer.optimizer.state.values())
            exact = (
                empty
                and len(after) == len(before)
                and all(
                    torch.equal(after[i][k], v) and after[i][k].device == trainer.device
                    for i, s in before.items()
                    for k, v in s.items()
                )
            )
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    torch.save({"params": params, "metrics": metrics, "exact": exact}, Path(folder) / "core.pt")


def _fed(trainer: Any, stream: StreamStep, step: int, samples: list) -> dict:  # type: ignore[type-arg]
    """The step opened on its first two micro-steps, the others fed one at a time by
    another thread (as groups finish), then sealed; the core works meanwhile."""

    def feed() -> None:
        for sample in samples[2:]:
            time.sleep(SLOW_S)
            stream.feed(step, [sample])
        stream.seal(step, count_fresh(samples, trainer.version, trainer.staleness_bound))

    stream.open(step, samples[:2])
    feeder = threading.Thread(target=feed)
    feeder.start()
    out = stream.finish(step)
    feeder.join()
    return out


def _satellite_report(trainer: Any, folder: str, took: list[bool], claimed: list[int]) -> None:
    report = {"took": took, "optimizer_state": len(trainer.optimizer.state), "claimed": claimed}
    torch.save(report, Path(folder) / "satellite.pt")


def _run(tmp_path: Path, mode: str) -> tuple[dict, dict | None]:  # type: ignore[type-arg]
    folder = tmp_path / mode
    folder.mkdir()
    with world_port() as port:
        mp.spawn(_process, args=(port, str(folder), mode), nprocs=2)
    sat = folder / "satellite.pt"
    return torch.load(folder / "core.pt"), torch.load(sat) if sat.exists() else None


@pytest.mark.parametrize("mode", ["alone", "join", "leave", "fed"])
def test_a_streamed_step_equals_the_plain_step_whoever_joins(tmp_path: Path, mode: str) -> None:
    plain = _trainer()
    want_metrics = [plain.step(_batch()) for _ in range(STEPS)]
    want = {n: p.detach().clone() for n, p in plain.model.named_parameters()}
    core, sat = _run(tmp_path, mode)
    worst = max(_relative(core["params"][n], w) for n, w in want.items())
    assert worst < 1e-5, f"{mode}: parameters differ by {worst:.2e} relative"
    for g, w in zip(core["metrics"], want_metrics, strict=True):
        assert g["version"] == w["version"] and g["tokens"] == w["tokens"]
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-5, abs=1e-7)
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5)
    assert core["exact"], "the optimizer state changed on its way to host memory and back"
    members = [m["members"] for m in core["metrics"]]
    if mode == "alone":
        assert members == [1.0, 1.0] and sat is None
        return
    assert sat is not None and sat["optimizer_state"] == 0  # weights only
    if mode == "join":  # it joined after the core's first two micro-steps and took some
        assert members == [2.0, 2.0] and sat["took"] == [True, True]
        assert sat["claimed"] and min(sat["claimed"]) >= 2
    elif mode == "fed":  # both worked on micro-steps fed after the step opened
        assert members == [2.0, 2.0] and sat["took"] == [True, True]
        assert sat["claimed"] and max(sat["claimed"]) >= 2
    else:
        assert members == [2.0, 1.0] and sat["took"] == [True] and sat["claimed"]
