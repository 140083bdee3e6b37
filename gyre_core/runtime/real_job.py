"""``backend: real``: agent sessions on engines served by Ray unit actors, a trainer
updating the policy from deduplicated trees, and the configured policy moving units
between rollout and training (see :mod:`gyre_core.runtime.loop`).

The driver process holds the sessions (asyncio tasks), the router, the policy's decisions
and the batches, and no model: units hold engines, or the sharded training state in the
run's training group (:mod:`~gyre_core.runtime.train_group`). Before the loop, a warm start
or a resumed checkpoint runs on a group of every unit, whose weights the engines start
from. Resume: the checkpoint of the last step records which rollouts were trained and
which finished but were not yet; the rest run again (none is trained twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gyre_core import events as ev
from gyre_core.cluster import IDLE, ROLLOUT
from gyre_core.config import RunConfig
from gyre_core.rollout.engine import Engine
from gyre_core.rollout.engine_kinds import ENGINES
from gyre_core.runtime.benchmark import run_benchmark
from gyre_core.runtime.calibrate import write_calibration
from gyre_core.runtime.loop import MAX_SEQS, Loop, LoopStart, UnitSlot
from gyre_core.runtime.midrun_bench import BenchmarkEvery, Serve
from gyre_core.runtime.offpolicy import OffPolicyData
from gyre_core.runtime.plan import RunPlan
from gyre_core.runtime.ray_backend import RESOURCE, UnitActor, UnitEngine, start_ray
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.step_books import StepBooks
from gyre_core.runtime.stream_group import StreamGroup
from gyre_core.runtime.sysmetrics import SysMetricsPoller
from gyre_core.runtime.threaded_sink import ThreadedSink
from gyre_core.runtime.timed_router import TimedRouter
from gyre_core.runtime.train_group import Source, TrainGroup
from gyre_core.runtime.warm_start import WarmStart, missed_message
from gyre_core.scheduler.base import Policy
from gyre_core.scheduler.policies import policy_for
from gyre_core.train.member import CHECKPOINT
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
    plan = RunPlan.of(cfg)  # every value the driver and the loop take from the config
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
        settings = ENGINES[cfg.model.engine].settings(cfg, model_dir, _has_gpus())  # no server yet
        run = Setting(plan, threaded, workdir, model_dir, say, clock)
        summary = asyncio.run(_run(run, should_stop, resume, settings))
    finally:  # also when the sink failed: close() never raises, so Ray always goes down
        threaded.close()
        if started_ray:
            ray.shutdown()  # the unit actors (engines, trainers) end with the driver's job
    threaded.check()  # a sink that failed on the run's last events fails the run too
    return summary


REFERENCE_FILE = "reference.safetensors"  # the KL's reference when it is not the checkpoint
CHECKPOINTS = "checkpoints"  # the run folder's checkpoints


@dataclass(frozen=True)
class Setting:
    """Where a run happens: its plan, its event sink, its folders (the run's, the model's),
    its progress lines and its clock."""

    plan: RunPlan
    sink: ev.EventSink
    workdir: Path
    model_dir: Path
    say: Callable[[str], None]
    clock: Callable[[], float]


@dataclass
class Prepared:
    """What the driver holds before any unit starts (:func:`_prepare`)."""

    factory: SessionFactory
    warm: WarmStart
    books: StepBooks
    trainer: TrainGroup
    start: LoopStart  # a resumed run's ready and pending rollouts, the off-policy data
    policy: Policy
    router: TimedRouter


@dataclass
class Outcome:
    """What the loop stage leaves for the finish: whether the run was cancelled, the
    benchmark before and after (``after`` is NaN when cancelled) and the loop's start."""

    cancelled: bool
    first: int
    before: float
    after: float
    loop_start: float


async def _run(
    run: Setting, should_stop: Callable[[], bool], resume: bool, settings: Any
) -> dict[str, Any]:
    """The run in stages: prepare, bring up, loop, finish (the units go back either way)."""
    cfg = run.plan.config
    prep = _prepare(run, resume)
    roles = prep.policy.initial_roles(run.plan.units)
    slots = await _make_units(cfg, run.model_dir, run.workdir, settings)
    sampler = SysMetricsPoller(cfg.cluster.sysmetrics_s, lambda: slots, run.sink, run.clock)
    sampler.start()  # from the warm start on, beside the loop
    try:
        loop, midrun = await _bring_up(run, prep, slots)
        # the engines' sequence cap (vLLM on CUDA: from its KV cache, vllm_settings.seq_cap)
        loop.max_seqs = getattr(settings, "max_num_seqs", 0) or MAX_SEQS
        await loop.bring_up(roles)  # every unit in its initial role, engines on current weights
        outcome = await _loop(run, prep, loop, midrun, should_stop)
        await sampler.stop()  # the run's last events are its status and summary
        return _finish(run, prep, loop, midrun, outcome)
    finally:
        await sampler.stop()  # before the units go: no sample asks a killed actor
        await prep.factory.aclose()  # the agents' endpoint, when it was started
        release_units(slots)  # also on failure: their resources go back to Ray


def _prepare(run: Setting, resume: bool) -> Prepared:
    """Stage 1, before any unit starts: the sessions, the off-policy data (a bad file fails
    the run at once), the books, the training group and, on a resume, the checkpoint's
    state; then the run's ``running`` status."""
    cfg = run.plan.config
    factory = SessionFactory(cfg, run.model_dir, run.sink, run.clock)
    start = LoopStart()
    if cfg.train.offpolicy_data:
        path, groups = Path(cfg.train.offpolicy_data), cfg.train.offpolicy_groups
        data = OffPolicyData.read(path, factory.tokenizer, groups, cfg.model.chat_template)
        start.imported = data.take
    warm, books = WarmStart(factory), StepBooks(cfg, run.sink, run.clock)
    trainer = (StreamGroup if cfg.scheduler.streaming else TrainGroup)(cfg, run.workdir)
    reference = run.workdir / REFERENCE_FILE
    if reference.exists() and resume:  # the warm-started policy, the KL's anchor
        trainer.reference = str(reference)
    if resume and (state := books.restore(run.workdir / CHECKPOINTS)) is not None:
        path, version, start.ready, start.pending, start.first_new = state
        trainer.source = Source(CHECKPOINT, str(path), version, strict=True)
        trainer.version = version
        ready, pending = len(start.ready), len(start.pending)
        run.say(f"resumed at version {version}: {ready} rollouts ready, {pending} to run")
    status = ev.RunStatus(
        t=run.clock(), status="running", step=trainer.version, message=run.plan.policy
    )
    run.sink.emit(status)
    policy = policy_for(cfg.scheduler, run.plan.units)
    router = TimedRouter({}, mode=run.plan.switch_mode, wait_s=600.0, clock=run.clock)
    return Prepared(factory, warm, books, trainer, start, policy, router)


async def _bring_up(
    run: Setting, prep: Prepared, slots: list[UnitSlot]
) -> tuple[Loop, BenchmarkEvery]:
    """Stage 2, the units started: the warm start or the resumed state on a group of every
    unit (the engines start from its weights), then the loop with its collaborators."""
    trainer, plan, router = prep.trainer, run.plan, prep.router
    await trainer.attach(slots)  # a streaming world forms over every unit, once
    warm_first = trainer.version == 0 and plan.warm_start
    if warm_first or trainer.source.kind == CHECKPOINT:
        await trainer.resize(slots)  # every unit trains the warm start or reads the state
        if warm_first:
            await _warm_start(plan.config, trainer, prep.warm, run.workdir, run.say)
        prep.start.state_ref = await trainer.weights()
        await trainer.resize([])  # offloaded: the initial training units take it back
    midrun = BenchmarkEvery(
        plan.config.rollout.benchmark_every,
        plan.steps,
        lambda r, v: run_benchmark(prep.factory, r, v),
        run.say,
        serve_on_actor(str(run.model_dir)),
    )
    ckpt_root = run.workdir / CHECKPOINTS

    async def on_step(
        batch: list[Rollout], metrics: dict[str, Any], trees: dict[str, PrefixTree]
    ) -> None:
        await prep.books.step_done(trainer, batch, metrics, loop, ckpt_root, trees)
        midrun.after_step(loop.state_ref, trainer.version)

    loop = Loop(
        plan,
        policy=prep.policy,
        units=slots,
        router=router,
        trainer=trainer,
        sink=run.sink,
        clock=run.clock,
        start_session=lambda i: prep.factory.session(i, router, loop),
        on_step=on_step,
        start=prep.start,
    )
    router.on_dead = loop.mark_dead
    router.on_migrate = prep.factory.migrated
    return loop, midrun


async def _loop(
    run: Setting,
    prep: Prepared,
    loop: Loop,
    midrun: BenchmarkEvery,
    should_stop: Callable[[], bool],
) -> Outcome:
    """Stage 3: the benchmark before, the loop until its last step (or a stop), the
    benchmark after (a finished run's)."""
    trainer, factory, router = prep.trainer, prep.factory, prep.router
    first = trainer.version  # 0, or where a resumed run continues
    before = await run_benchmark(factory, router, first)
    run.say(f"benchmark before: {before:.3f}")
    cancelled = False
    loop_start = run.clock()  # calibration compares the simulator with the loop's time
    try:
        await loop.run(should_stop)
        cancelled = trainer.version < run.plan.steps
    finally:
        await loop.settle()
        await midrun.finish()
    after = float("nan")
    if not cancelled:
        await loop.ensure_engine()  # the final benchmark needs one: a trainer comes back
        after = await run_benchmark(factory, router, trainer.version)
        run.say(f"benchmark after: {after:.3f}")
    return Outcome(cancelled, first, before, after, loop_start)


def _finish(
    run: Setting, prep: Prepared, loop: Loop, midrun: BenchmarkEvery, out: Outcome
) -> dict[str, Any]:
    """Stage 4: the run's last status, and on a finished run its summary (``summary.json``)
    and calibration (``costs.json``, the workload)."""
    plan, version = run.plan, prep.trainer.version
    if out.cancelled:
        run.sink.emit(
            ev.RunStatus(
                t=run.clock(), status="cancelled", step=version, message="cancelled by user"
            )
        )
        return {"policy": plan.policy, "backend": "real", "status": "cancelled", "steps": version}
    router = prep.router
    summary = prep.books.summary(
        loop, router, out.before, out.after, run.clock(), prep.factory, prep.warm
    )
    summary["benchmark_by_version"] = {out.first: out.before, **midrun.scores, version: out.after}
    (run.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    write_calibration(run.workdir, plan.config, loop, router, out.loop_start)
    run.sink.emit(ev.RunStatus(t=run.clock(), status="succeeded", step=version, message=""))
    return summary


async def _make_units(
    cfg: RunConfig, model_dir: Path, workdir: Path, settings: Any = None
) -> list[UnitSlot]:
    """The run's units (idle, bound for rollout): ``cluster.gpus_per_unit`` actors each,
    placed together on one node (a placement group per unit; ``num_gpus`` per process on a
    cluster with GPUs, the ``gpu_unit`` resource otherwise), each unit knowing its node."""
    tag = uuid.uuid4().hex[:8]  # actors are named (gyre-<tag>-unit-<u>) for operators
    per = cfg.cluster.gpus_per_unit
    gpus = _has_gpus()
    bundle = {"GPU": 1} if gpus else {RESOURCE: 1}
    groups = [
        placement_group([bundle] * per, strategy="STRICT_PACK") for _ in range(cfg.cluster.units)
    ]
    await asyncio.gather(*(g.ready() for g in groups))
    slots = []
    for u, group in enumerate(groups):
        procs = [
            UnitActor.options(  # type: ignore[attr-defined]
                name=f"gyre-{tag}-unit-{u}" + (f"-p{j}" if j else ""),
                num_gpus=1 if gpus else 0,
                resources={} if gpus else {RESOURCE: 1},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=j
                ),
            ).remote(
                u,
                str(model_dir),
                engine=cfg.model.engine,
                work_dir=str((workdir / "units").resolve()),
                proc=j,
                settings=settings,
            )
            for j in range(per)
        ]
        if gpus:  # the engine's process starts a server over every GPU of its unit
            ids = await asyncio.gather(*(p.gpu_ids.remote() for p in procs))
            await procs[0].serve_on.remote([g for proc_ids in ids for g in proc_ids])
        slots.append(UnitSlot(u, procs[0], IDLE, ROLLOUT, procs=procs, placement=group))
    nodes = await asyncio.gather(*(s.actor.node_id.remote() for s in slots))
    for s, node in zip(slots, nodes, strict=True):
        s.node = str(node)  # where Ray placed the unit: role_change events carry it
    return slots


def _has_gpus() -> bool:
    """Whether the Ray cluster has GPUs (units then take ``num_gpus``, engines run CUDA)."""
    return bool(ray.cluster_resources().get("GPU", 0) > 0)  # type: ignore[no-untyped-call]


def release_units(slots: list[UnitSlot]) -> None:
    """End the units' processes and free their placement groups (their resources)."""
    for s in slots:
        for proc in s.procs:
            with contextlib.suppress(Exception):  # a dead unit is already gone
                ray.kill(proc)
        if s.placement is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(s.placement)


def serve_on_actor(model_dir: str) -> Serve:
    """A :data:`~gyre_core.runtime.midrun_bench.Serve` on a Ray actor of its own (a torch
    engine), so that a mid-run benchmark puts no model in the driver."""

    @asynccontextmanager
    async def serve(weights: Any, version: int) -> AsyncIterator[Engine]:
        actor = UnitActor.options(num_cpus=0).remote(-1, model_dir)  # type: ignore[attr-defined]
        try:
            await actor.start_engine.remote(weights, version, MAX_SEQS)
            yield UnitEngine(actor, version)
        finally:
            with contextlib.suppress(Exception):
                ray.kill(actor)

    return serve


async def _warm_start(
    cfg: RunConfig, trainer: TrainGroup, warm: WarmStart, workdir: Path, say: Callable[[str], None]
) -> None:
    """The warm start before RL (run, cached or loaded from ``warm_start.weights``), on
    the group of every unit: the KL reference becomes the warm-started policy (a weights
    file in the run folder, which a resumed run keeps) and RL starts with fresh optimizer
    moments unless the config says otherwise."""
    say(
        f"warm start: from {cfg.warm_start.weights}"
        if cfg.warm_start.weights
        else f"warm start: {cfg.warm_start.steps} supervised steps on scripted demos"
    )
    losses = await warm.run(trainer)
    if cfg.train.kl_coef > 0:  # the KL anchors RL to the warm start, not the init
        await trainer.write_weights(workdir / REFERENCE_FILE)
        await trainer.set_reference(str(workdir / REFERENCE_FILE))
    if cfg.warm_start.fresh_optimizer:
        await trainer.reset_optimizer()
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
