"""A real run obeys the admission settings every policy shares: the cap on running
rollouts (``scheduler.max_concurrent_rollouts``) and the admission bound apart from the
masking bound (``scheduler.admission_staleness``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]


def test_a_real_run_never_runs_more_rollouts_than_its_cap(ray_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = yaml.safe_load((ROOT / "configs" / "demo-async.yaml").read_text())
    d.update(steps=2, cluster={"units": 3})
    d["scheduler"].update(max_concurrent_rollouts=3, admission_staleness=0, staleness_bound=1)
    d["rollout"].update(tasks_per_step=1, group_size=4, benchmark_tasks=1, max_turns=4)
    sink = ListSink()
    out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 2
    running = peak = 0
    for e in sink.events:  # in the order the run emitted them
        if e.kind == "rollout_started":
            running += 1
            peak = max(peak, running)
        elif e.kind == "rollout_finished":
            running -= 1
    assert peak == 3  # 4 rollouts a step, never more than 3 at once
    starts = [e for e in sink.events if e.kind == "rollout_started"]
    assert len(starts) == 8
    # admission 0 versions ahead: a rollout of step k starts once version k is out, so its
    # first token is of version k at least
    finished = {e.rollout_id: e for e in sink.events if e.kind == "rollout_finished"}
    assert all(finished[f"r{i}"].versions[0] >= i // 4 for i in range(8))
