"""``backend: real``: agent sessions on engines served by Ray unit actors, a trainer
updating the policy from deduplicated trees, and the configured policy moving units
between rollout and training (see :mod:`gyre_core.runtime.loop`).

The driver process holds the sessions (asyncio tasks), the router and the master copy of
the weights with the optimizer; units hold engines or training replicas. Resume: the
checkpoint of the last step records which rollouts were trained and which finished but
were not yet; the rest run again (none is trained twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch
from safetensors.torch import load_file, save_file

from gyre_core import events as ev
from gyre_core.cluster import IDLE, ROLLOUT
from gyre_core.config import RunConfig
from gyre_core.rollout.engine import ENGINES
from gyre_core.runtime.benchmark import run_benchmark
from gyre_core.runtime.calibrate import write_calibration
from gyre_core.runtime.loop import Loop, UnitSlot
from gyre_core.runtime.midrun_bench import BenchmarkEvery
from gyre_core.runtime.ray_backend import UnitActor, start_ray
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.step_books import StepBooks
from gyre_core.runtime.threaded_sink import ThreadedSink
from gyre_core.runtime.timed_router import TimedRouter
from gyre_core.runtime.warm_start import WarmStart, missed_message
from gyre_core.scheduler.policies import policy_for
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.format import Rollout, read_rollouts
from gyre_core.trajectory.tree import PrefixTree
from gyre_core.trajectory.writer import write_rollouts


def run_real(
    cfg: RunConfig,
    *,
    sink: ev.EventSink,
    workdir: Path,
    should_stop: Callable[[], bool],
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    say = progress or (lambda _line: None)
    ENGINES[cfg.model.engine].check()  # before any work: say what to install if missing
    t_start = time.perf_counter()

    def clock() -> float:  # the run's clock: seconds since it began (the events' t)
        return round(time.perf_counter() - t_start, 3)

    torch.manual_seed(cfg.seed)
    model_dir = make_model_dir(cfg, workdir, sink, clock)
    started_ray = start_ray(
        cfg.cluster.ray_address,
        cfg.cluster.units,
        cfg.cluster.gpus_per_unit,
        cfg.cluster.object_store_mb,
    )
    threaded = ThreadedSink(sink)  # sinks may block (database writes): keep them off the loop
    try:
        summary = asyncio.run(
            _run(cfg, threaded, workdir, model_dir, should_stop, resume, say, clock)
        )
    finally:  # also when the sink failed: close() never raises, so Ray always goes down
        threaded.close()
        if started_ray:
            ray.shutdown()  # the unit actors (engines, trainers) end with the driver's job
    threaded.check()  # a sink that failed on the run's last events fails the run too
    return summary


REFERENCE_FILE = "reference.safetensors"  # the KL's reference when it is not the checkpoint


async def _run(
    cfg: RunConfig,
    sink: ev.EventSink,
    workdir: Path,
    model_dir: Path,
    should_stop: Callable[[], bool],
    resume: bool,
    say: Callable[[str], None],
    clock: Callable[[], float],
) -> dict[str, Any]:
    factory = SessionFactory(cfg, model_dir, sink, clock)
    warm, books = WarmStart(factory), StepBooks(cfg, sink, clock)
    trainer = factory.make_trainer()
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    total = cfg.steps * per_step
    ckpt_root = workdir / "checkpoints"
    ready: list[Rollout] = []
    pending: list[int] | None = None
    if resume and (state := books.restore(trainer, ckpt_root)) is not None:
        ready, pending = state
        reference = workdir / REFERENCE_FILE
        if trainer.ref_model is not None and reference.exists():  # the warm-started policy
            trainer.ref_model.load_state_dict(load_file(str(reference)))
        say(
            f"resumed at version {trainer.version}: {len(ready)} rollouts ready, "
            f"{len(pending)} to run"
        )
    sink.emit(ev.RunStatus(t=clock(), status="running", step=trainer.version, message=cfg.policy))

    units_n = cfg.cluster.units
    policy = policy_for(cfg.scheduler, units_n)
    roles = policy.initial_roles(units_n)
    router = TimedRouter({}, mode=cfg.scheduler.switch_mode, wait_s=600.0, clock=clock)
    slots = await _make_units(cfg, model_dir, workdir)
    if trainer.version == 0 and (cfg.train.warm_start_steps or cfg.train.warm_start_from):
        await _warm_start(cfg, trainer, warm, workdir, say)

    midrun = BenchmarkEvery(
        cfg.rollout.benchmark_every, cfg.steps, lambda r, v: run_benchmark(factory, r, v), say
    )

    def on_step(
        batch: list[Rollout], metrics: dict[str, Any], trees: dict[str, PrefixTree]
    ) -> None:
        books.step_done(trainer, batch, metrics, loop, ckpt_root, trees)
        midrun.after_step(trainer.model, trainer.version)

    loop = Loop(
        policy=policy,
        units=slots,
        router=router,
        trainer=trainer,
        run_config=cfg,
        sink=sink,
        clock=clock,
        start_session=lambda i: factory.session(i, router, loop),
        total=total,
        per_step=per_step,
        steps=cfg.steps,
        staleness=cfg.scheduler.staleness_bound,
        drain_s=cfg.scheduler.drain_deadline_s,
        on_step=on_step,
        ready=ready,
        pending=pending,
        batch_order=cfg.scheduler.batch_order,
    )
    router.on_dead = loop.mark_dead
    router.on_migrate = factory.migrated
    await loop.bring_up(roles)  # every unit in its initial role, engines on current weights
    first = trainer.version  # 0, or where a resumed run continues
    before = await run_benchmark(factory, router, first)
    say(f"benchmark before: {before:.3f}")
    cancelled = False
    loop_start = clock()  # calibration compares the simulator with the loop's time
    try:
        await loop.run(should_stop)
        cancelled = trainer.version < cfg.steps
    finally:
        await loop.settle()
        await midrun.finish()
    if not cancelled:
        await loop.ensure_engine()  # the final benchmark needs one: a trainer comes back
        after = await run_benchmark(factory, router, trainer.version)
        say(f"benchmark after: {after:.3f}")
    for s in slots:
        with contextlib.suppress(Exception):  # a dead unit is already gone
            ray.kill(s.actor)
    if cancelled:
        sink.emit(
            ev.RunStatus(
                t=clock(), status="cancelled", step=trainer.version, message="cancelled by user"
            )
        )
        return {
            "policy": cfg.policy,
            "backend": "real",
            "status": "cancelled",
            "steps": trainer.version,
        }
    summary = books.summary(loop, router, before, after, clock(), factory, warm)
    summary["benchmark_by_version"] = {first: before, **midrun.scores, trainer.version: after}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    write_calibration(workdir, cfg, loop, router, loop_start)  # costs.json, workload
    sink.emit(ev.RunStatus(t=clock(), status="succeeded", step=trainer.version, message=""))
    return summary


async def _make_units(cfg: RunConfig, model_dir: Path, workdir: Path) -> list[UnitSlot]:
    """The run's unit actors (idle, bound for rollout), each knowing the Ray node it is on."""
    tag = uuid.uuid4().hex[:8]  # actors are named (gyre-<tag>-unit-<u>) for operators
    slots = [
        UnitSlot(
            u,
            UnitActor.options(  # type: ignore[attr-defined]
                name=f"gyre-{tag}-unit-{u}", resources={"gpu_unit": cfg.cluster.gpus_per_unit}
            ).remote(
                u,
                str(model_dir),
                engine=cfg.model.engine,
                work_dir=str((workdir / "units").resolve()),
            ),
            IDLE,
            ROLLOUT,
        )
        for u in range(cfg.cluster.units)
    ]
    nodes = await asyncio.gather(*(s.actor.node_id.remote() for s in slots))
    for s, node in zip(slots, nodes, strict=True):
        s.node = str(node)  # where Ray placed the unit: role_change events carry it
    return slots


async def _warm_start(
    cfg: RunConfig, trainer: Trainer, warm: WarmStart, workdir: Path, say: Callable[[str], None]
) -> None:
    """The warm start before RL (run, cached or loaded from ``train.warm_start_from``): the KL
    reference becomes the warm-started policy (kept in the run folder for a resumed run)
    and RL starts with fresh optimizer moments unless the config says otherwise."""
    say(
        f"warm start: from {cfg.train.warm_start_from}"
        if cfg.train.warm_start_from
        else f"warm start: {cfg.train.warm_start_steps} supervised steps on scripted demos"
    )
    losses = await warm.run(trainer)
    if trainer.ref_model is not None:  # the KL anchors RL to the warm start, not the init
        trainer.ref_model.load_state_dict(trainer.model.state_dict())
        # kept for a resumed run, which skips the warm start
        weights = {k: v.contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(weights, str(workdir / REFERENCE_FILE))
    if cfg.train.warm_start_fresh_optimizer:
        trainer.reset_optimizer()
    say(
        f"warm start done: {len(losses)} steps, last loss "
        f"{losses[-1] if losses else float('nan'):.3f}, "
        f"{warm.warm_start_s:.0f} s" + (" (cached)" if warm.warm_start_cached else "")
    )
    if warm.missed_target is not None:
        say(missed_message(warm.missed_target, warm.missed_field))


def load_ready(path: Path) -> list[Rollout]:
    return list(read_rollouts(path)) if path.exists() else []


def save_ready(path: Path, rollouts: list[Rollout]) -> None:
    write_rollouts(path, rollouts)
