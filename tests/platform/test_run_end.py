"""How a run ends, through launch_run's body in this process (service mode): exactly one
terminal ``run_status`` per launch (the worker's, not also the job's), a failure reported
in one line without a traceback, and a paused simulated run that resumes where it
stopped instead of replaying its steps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from gyre_web.runs import services
from gyre_web.runs.models import Run, RunEvent, Status

from workers.tasks import launch_run

pytestmark = pytest.mark.django_db(transaction=True)
ENDS = {"succeeded", "failed", "cancelled", "paused"}


@pytest.fixture
def exp(people):
    return services.create_experiment(team=people["team"], name="ends")


def _statuses(run_id: int) -> list[str]:
    rows = RunEvent.objects.filter(run_id=run_id, kind="run_status").order_by("seq")
    return [r.data["status"] for r in rows]


def _last(run_id: int) -> RunEvent:
    return RunEvent.objects.filter(run_id=run_id).order_by("-seq")[0]


def test_a_run_ends_with_one_terminal_status_event(exp, sim_config):
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    assert launch_run.apply(args=[run.pk]).get() == Status.SUCCEEDED
    ends = [s for s in _statuses(run.pk) if s in ENDS]
    assert ends == ["succeeded"] and _last(run.pk).data["status"] == "succeeded"


def test_a_failed_run_reports_one_line_and_no_traceback(exp, sim_config):
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    bad = {**sim_config, "sim": {**sim_config["sim"], "rollouts": 4, "rollouts_per_step": 8}}
    Run.objects.filter(pk=run.pk).update(config=bad)  # past the API's validation
    assert launch_run.apply(args=[run.pk]).get() == Status.FAILED
    run.refresh_from_db()
    assert run.error == "ConfigError: sim.rollouts: fewer than one step of sim.rollouts_per_step"
    assert [s for s in _statuses(run.pk) if s in ENDS] == ["failed"]
    assert _last(run.pk).data["message"] == run.error


def test_a_job_that_raises_inside_ends_with_the_workers_one_status(exp, sim_config):
    # The job's checkpoint cannot be written (a folder holds its temporary file's name):
    # run_job raises after its own ``failed`` status, which the worker's replaces.
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    (Path(settings.GYRE_RUNS_DIR) / str(run.pk) / "sim-checkpoint.tmp").mkdir(parents=True)
    assert launch_run.apply(args=[run.pk]).get() == Status.FAILED
    run.refresh_from_db()
    assert run.error.startswith("IsADirectoryError: [Errno 21]") and "\n" not in run.error
    assert "Traceback" not in run.error and 'File "' not in run.error
    assert [s for s in _statuses(run.pk) if s in ENDS] == ["failed"]
    assert _last(run.pk).data == {"status": "failed", "step": 1, "message": run.error}


def test_a_paused_sim_run_resumes_without_replaying_its_steps(exp, sim_config):
    sim_config.update(steps=3, scheduler={"policy": "colocate"})  # steps spread in time
    sim_config["sim"]["rollouts"] = 24
    probe = services.create_run(experiment=exp, config=sim_config, launch=False)
    launch_run.apply(args=[probe.pk])
    span = RunEvent.objects.filter(run=probe).order_by("-t")[0].t
    sim_config["sim"]["speed"] = span / 3.0  # the replay takes about 3 s: a pause lands mid-run
    run = services.create_run(experiment=exp, config=sim_config, launch=False)

    def pause_after_step_one() -> None:
        deadline = time.monotonic() + 30
        try:
            while not RunEvent.objects.filter(run=run, kind="step_finished").exists():
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
            services.request_stop(run=Run.objects.get(pk=run.pk), mode="pause")
        finally:
            connection.close()  # this thread's own connection

    pauser = threading.Thread(target=pause_after_step_one)
    pauser.start()
    assert launch_run.apply(args=[run.pk], task_id="t-1").get() == Status.PAUSED
    pauser.join()
    done = RunEvent.objects.filter(run=run, kind="step_finished").count()
    assert 1 <= done < 3, "the pause landed mid-run"
    services.transition(run.pk, Status.QUEUED, resume_requested=True)  # as resume_run does
    assert launch_run.apply(args=[run.pk], task_id="t-1").get() == Status.SUCCEEDED

    steps = RunEvent.objects.filter(run=run, kind="step_finished").order_by("seq")
    assert [e.data["step"] for e in steps] == [1, 2, 3]  # each step logged once
    assert [s for s in _statuses(run.pk) if s in ENDS] == ["paused", "succeeded"]
    started = RunEvent.objects.filter(run=run, kind="rollout_started")
    assert started.count() == started.values("data__rollout_id").distinct().count() == 24
