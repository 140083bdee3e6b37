"""``backend: sim``: the cluster simulator runs the configured policy on a synthetic
workload, emitting the same events a real run does (on simulated time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.scheduler.policies import make_policy
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate


def run_sim(
    cfg: RunConfig,
    *,
    sink: ev.EventSink,
    workdir: Path,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    del workdir, resume  # a simulated run is cheap to redo and keeps no checkpoint
    s = cfg.sim
    costs = replace(
        CostModel(),
        gpus=s.gpus,
        rollouts_per_step=s.rollouts_per_step,
        group_size=min(cfg.rollout.group_size, s.rollouts_per_step),
        staleness=cfg.scheduler.staleness_bound,
    )
    units = s.gpus // costs.gpus_per_unit
    split = None
    if cfg.policy == "async" and cfg.scheduler.rollout_units:
        split = (cfg.scheduler.rollout_units, units - cfg.scheduler.rollout_units)
    rollouts = min(s.rollouts, cfg.steps * s.rollouts_per_step)
    trace = generate(s.workload, rollouts, cfg.seed, group_size=costs.group_size)  # type: ignore[arg-type]
    policy = make_policy(cfg.policy, units, split)
    if progress:
        progress(f"sim: {rollouts} {s.workload} rollouts on {s.gpus} GPUs, policy {cfg.policy}")
    t0 = time.perf_counter()
    summary = Simulator(
        trace,
        costs,
        policy,
        mode=cfg.scheduler.switch_mode,
        batch_order=cfg.scheduler.batch_order,
        sink=sink,
    ).run()
    summary.update(
        policy=cfg.policy, backend="sim", status="succeeded",
        sim_wall_s=round(time.perf_counter() - t0, 3),
    )  # fmt: skip
    return summary
