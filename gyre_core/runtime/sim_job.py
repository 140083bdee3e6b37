"""``backend: sim``: the cluster simulator runs the configured policy on a synthetic
workload, emitting the same events a real run does (on simulated time).

Resume: a simulated run is deterministic (its config and seed fix every event), so its
checkpoint is a position in its event stream, ``sim-checkpoint.json`` in the workdir:
the events emitted up to the last finished step, or up to the stop when it was cancelled
or paused, recorded once the sink has stored them (a killed worker loses no event). A resumed run computes the simulation again and emits only what follows that
position, so each step is logged once. A checkpoint of another config is ignored.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.runtime.job import Cancelled
from gyre_core.scheduler.policies import policy_for
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate

CHECKPOINT = "sim-checkpoint.json"


class StreamCheckpoint:
    """A sink between the simulator and the run's sink: it drops the first ``skip`` events
    (emitted before the resume) and records the stream position after each step."""

    def __init__(self, sink: ev.EventSink, path: Path, config: str, skip: int = 0) -> None:
        self.sink, self.path, self.config, self.skip = sink, path, config, skip
        self.events = 0  # events of the stream so far, emitted now or before the resume
        self.step = 0

    def emit(self, event: ev.Event) -> None:
        self.events += 1
        if isinstance(event, ev.StepFinished):
            self.step = event.step
        if self.events <= self.skip:
            return
        self.sink.emit(event)  # counted first: a stop raised after forwarding still counts
        if isinstance(event, ev.StepFinished):
            self.save()

    def save(self) -> None:
        ev.flush_sink(self.sink)  # what the checkpoint counts as emitted is stored first
        state = {"config": self.config, "events": self.events, "step": self.step}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)


def config_digest(cfg: RunConfig) -> str:
    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def load_position(path: Path, digest: str) -> tuple[int, int]:
    """(events, step) of a checkpoint of this config; (0, 0) when there is none."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0, 0
    if not isinstance(state, dict) or state.get("config") != digest:
        return 0, 0
    return int(state.get("events", 0)), int(state.get("step", 0))


def run_sim(
    cfg: RunConfig,
    *,
    sink: ev.EventSink,
    workdir: Path,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    s = cfg.sim
    costs = replace(
        CostModel(),
        gpus=s.gpus,
        rollouts_per_step=s.rollouts_per_step,
        group_size=min(cfg.rollout.group_size, s.rollouts_per_step),
        staleness=cfg.scheduler.staleness_bound,
        admission_staleness=cfg.scheduler.admission_staleness,
        max_concurrent=cfg.scheduler.max_concurrent_rollouts,
        burst_steps=cfg.scheduler.bursts,
        streaming=int(cfg.scheduler.streaming),
    )
    rollouts = min(s.rollouts, cfg.steps * s.rollouts_per_step)
    trace = generate(s.workload, rollouts, cfg.seed, group_size=costs.group_size)  # type: ignore[arg-type]
    policy = policy_for(cfg.scheduler, costs.units)
    digest = config_digest(cfg)
    skip, step = load_position(workdir / CHECKPOINT, digest) if resume else (0, 0)
    stream = StreamCheckpoint(sink, workdir / CHECKPOINT, digest, skip)
    if progress:
        progress(f"sim: {rollouts} {s.workload} rollouts on {s.gpus} GPUs, policy {cfg.policy}")
        if skip:
            progress(f"sim: resumed after step {step} ({skip} events already emitted)")
    t0 = time.perf_counter()
    simulator = Simulator(
        trace,
        costs,
        policy,
        mode=cfg.scheduler.switch_mode,
        batch_order=cfg.scheduler.batch_order,
        sink=stream,
    )
    try:
        summary = simulator.run()
    except Cancelled:  # cancelled or paused: a resume continues from exactly here
        if stream.events > skip:
            stream.save()
        raise
    summary.update(
        policy=cfg.policy,
        backend="sim",
        status="succeeded",
        sim_wall_s=round(time.perf_counter() - t0, 3),
    )
    return summary
