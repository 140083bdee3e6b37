"""The worker decides again: at every launch (and resume) it checks the stored config under
its own settings and refuses, by field, what its operator does not allow; nothing runs.
launch_run's body in this process, on the real database (service mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gyre_web.runs import services
from gyre_web.runs.models import Run, RunEvent, Status

from workers.tasks import launch_run

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def exp(people, settings, monkeypatch):
    monkeypatch.chdir(ROOT)
    settings.GYRE_PLUGINS = ()
    settings.RAY_ADDRESS = ""
    settings.GYRE_MLFLOW_TRACKING_URI = ""
    return services.create_experiment(team=people["team"], name="worker trust")


def _nothing_ran(run: Run) -> None:
    kinds = set(RunEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds == {"run_status"}, kinds  # no rollout, no step
    statuses = [e.data["status"] for e in RunEvent.objects.filter(run=run).order_by("seq")]
    assert statuses == ["failed"]  # never "running"
    assert not any((Path(services.run_dir(run.pk))).iterdir())


def test_a_flag_off_worker_refuses_an_agent_run_a_flag_on_web_accepted(
    people, exp, sim_config, settings, tmp_path
):
    marker = tmp_path / "ran"
    sim_config["rollout"] = {"agent_command": f"touch {marker}"}
    settings.GYRE_EXTERNAL_AGENTS = True  # the web server that accepted it
    run = services.create_run(experiment=exp, config=sim_config, created_by=people["member"])
    settings.GYRE_EXTERNAL_AGENTS = False  # the worker that receives it
    assert launch_run.apply(args=[run.pk], task_id=run.celery_task_id).get() == Status.FAILED
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert "rollout.agent_command" in run.error and "GYRE_EXTERNAL_AGENTS" in run.error
    assert "refused by this worker" in run.error
    _nothing_ran(run)
    assert not marker.exists()


def test_a_stored_config_past_the_api_is_refused_at_launch_and_at_resume(
    people, exp, sim_config, settings
):
    run = services.create_run(experiment=exp, config=sim_config, created_by=people["member"])
    bad = {**sim_config, "rollout": {"env": "subprocess:Popen", "tasks": "/etc/passwd"},
           "cluster": {"ray_address": "10.0.0.9:6379"}}  # fmt: skip
    Run.objects.filter(pk=run.pk).update(config=bad)  # as if an older web server took it
    assert launch_run.apply(args=[run.pk], task_id=run.celery_task_id).get() == Status.FAILED
    run.refresh_from_db()
    for field in ("rollout.env", "rollout.tasks", "cluster.ray_address"):
        assert field in run.error
    _nothing_ran(run)
    # A resume the web no longer checks (the reaper's, say) is refused again at launch.
    services.transition(run.pk, Status.QUEUED, resume_requested=True)
    assert launch_run.apply(args=[run.pk], task_id=run.celery_task_id).get() == Status.FAILED
    run.refresh_from_db()
    assert "rollout.env" in run.error and "subprocess:Popen" in run.error


def test_a_flag_on_worker_runs_what_its_operator_allows(people, exp, sim_config, settings):
    settings.GYRE_EXTERNAL_AGENTS = True
    run = services.create_run(experiment=exp, config=sim_config, created_by=people["member"])
    assert launch_run.apply(args=[run.pk], task_id=run.celery_task_id).get() == Status.SUCCEEDED
