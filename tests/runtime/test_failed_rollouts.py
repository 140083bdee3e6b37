"""A real run whose rollouts all fail before their first call (issue #44 bug 1: the first
step crashed with an IndexError on an empty tree): every step is skipped with nothing to
train, the run succeeds, and each step's metrics count the rollouts left out by cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from gyre_core.trajectory.failures import FIGURES
from gyre_core.trajectory.format import read_rollouts
from tests.runtime.conftest import tiny_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]


def test_a_run_whose_agent_dies_before_any_call_skips_its_steps(
    ray_cluster, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(ROOT)  # the agent's module imports from the repository root
    d = tiny_job()
    d["rollout"] = {**d["rollout"], "agent": "tests.runtime.dead_agent:agent"}
    sink = ListSink()
    out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == d["steps"], out
    steps = [e.metrics for e in sink.events if e.kind == "step_finished"]
    assert len(steps) == d["steps"]
    per_step = d["rollout"]["tasks_per_step"] * d["rollout"]["group_size"]
    for m in steps:
        assert set(FIGURES) <= set(m)
        assert m["skipped"] == 1.0 and m["excluded_agent"] == per_step
        assert m["groups_untrained"] == d["rollout"]["tasks_per_step"]
    rollouts = [r for p in (tmp_path / "rollouts").glob("step-*.jsonl") for r in read_rollouts(p)]
    assert rollouts and all(
        (r.status, r.failure, r.calls) == ("failed", "agent", []) for r in rollouts
    )
