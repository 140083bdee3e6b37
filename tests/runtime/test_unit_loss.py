"""A training unit lost while it sits in the train role (its node gone, its process killed):
the step that asks it for gradients marks it dead (it leaves the pool) and runs again on
the replicas that are left, instead of failing the run."""

from __future__ import annotations

import pytest

from gyre_core.config import RunConfig
from gyre_core.runtime import run_job
from tests.runtime.conftest import UnitKiller, tiny_job

pytestmark = pytest.mark.slow

CONFIG = tiny_job("elastic")


def test_a_dead_training_replica_leaves_the_pool_and_the_step_runs_again(ray_cluster, tmp_path):
    from gyre_core.runtime.session import make_model_dir

    model = make_model_dir(RunConfig.from_dict(CONFIG), tmp_path / "m")
    cfg = RunConfig.from_dict({**CONFIG, "model": {"checkpoint": str(model)}})
    # silently: nothing calls a training replica until a step does
    killer = UnitKiller(on="rollout_started", role="train", pick=min)
    out = run_job(cfg, sink=killer, workdir=tmp_path / "w")
    assert out["status"] == "succeeded" and out["steps"] == 2 and killer.killed
    assert killer.roles[killer.killed[0]] == "idle", "the dead replica leaves the pool"
    changes = [e for e in killer.events if e.kind == "role_change" and e.unit == killer.killed[0]]
    assert changes[-1].from_role == "train", "found dead by the step, not by a switch"
    steps = [e for e in killer.events if e.kind == "step_finished"]
    assert [e.step for e in steps] == [1, 2]
    started = {e.rollout_id for e in killer.events if e.kind == "rollout_started"}
    finished = {e.rollout_id for e in killer.events if e.kind == "rollout_finished"}
    assert started == finished and len(finished) == 4 and out["sessions_restarted"] == 0
