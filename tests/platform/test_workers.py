"""launch_run executed by a real Celery worker process (service mode: Postgres + Redis):
a sim run ends succeeded with contiguous event sequence numbers and derived rows; cancel
stops a long run promptly; a duplicate message does not launch a run twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection
from gyre_web.runs import services
from gyre_web.runs.models import MetricPoint, Run, RunEvent, Status
from gyre_web.trajectories.models import Rollout

from tests.platform import daphne

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TERMINAL = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PAUSED}


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker):
    """A real `celery worker` process on the test database and a private Redis db."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    db = connection.settings_dict
    env = dict(os.environ)
    env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-P", "solo",
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    yield proc
    daphne.stop(proc)  # any process: terminate, then kill


def _wait(run_id: int, until: set[str], timeout: float = 60.0) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status in until:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {run.status} after {timeout}s")


@pytest.fixture
def exp(people):
    return services.create_experiment(team=people["team"], name="w")


def test_launch_runs_a_sim_job_and_writes_its_events(worker, exp, sim_config):
    run = services.create_run(experiment=exp, config=sim_config)
    done = _wait(run.pk, TERMINAL)
    assert done.status == Status.SUCCEEDED, done.error
    assert done.started_at and done.finished_at and done.step == 2
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "kind"))
    assert [s for s, _ in events] == list(range(1, len(events) + 1))
    kinds = [k for _, k in events]
    assert kinds[0] == "run_status" and kinds[-1] == "run_status"
    assert {"rollout_started", "rollout_finished", "step_finished"} <= set(kinds)
    assert RunEvent.objects.get(run=run, seq=len(events)).data["status"] == "succeeded"
    assert Rollout.objects.filter(run=run, reward__isnull=False).count() == 16
    assert MetricPoint.objects.filter(run=run).values("step").distinct().count() == 2

    # The same message delivered again does nothing: the run is not launched twice.
    from workers.celery_app import app

    app.send_task("workers.tasks.launch_run", args=[run.pk], task_id=done.celery_task_id)
    time.sleep(1.5)
    assert RunEvent.objects.filter(run=run).count() == len(events)


def test_cancel_stops_a_running_job_promptly(worker, exp, sim_config):
    sim_config.update(steps=400)
    sim_config["sim"] = {
        "workload": "xlong",
        "rollouts": 8000,
        "gpus": 64,
        "rollouts_per_step": 20,
    }  # fmt: skip  — about a minute of work
    run = services.create_run(experiment=exp, config=sim_config)
    deadline = time.monotonic() + 60
    while RunEvent.objects.filter(run=run).count() < 20:
        assert time.monotonic() < deadline, "no events arrived"
        time.sleep(0.1)
    asked = time.monotonic()
    services.request_stop(run=Run.objects.get(pk=run.pk))
    done = _wait(run.pk, TERMINAL, timeout=30)
    assert done.status == Status.CANCELLED
    assert time.monotonic() - asked < 10
    assert done.step < 400
    last = RunEvent.objects.filter(run=run).order_by("-seq").first()
    assert last.kind == "run_status" and last.data["status"] == "cancelled"


def test_resume_relaunches_the_same_run_and_continues_its_event_log(worker, exp, sim_config):
    from django.db import transaction

    with transaction.atomic():  # cancelled before the worker can see it
        run = services.create_run(experiment=exp, config=sim_config)
        services.request_stop(run=run)
    time.sleep(1.0)  # the launch message is consumed and skipped
    assert Run.objects.get(pk=run.pk).status == Status.CANCELLED
    assert not RunEvent.objects.filter(run=run).exists()
    services.resume_run(run=Run.objects.get(pk=run.pk))
    done = _wait(run.pk, TERMINAL)
    assert done.status == Status.SUCCEEDED and not done.resume_requested
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_job_that_raises_ends_failed_with_its_error(worker, exp, sim_config):
    from workers.celery_app import app

    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    Run.objects.filter(pk=run.pk).update(config={**sim_config, "steps": 0}, celery_task_id="t-1")
    app.send_task("workers.tasks.launch_run", args=[run.pk], task_id="t-1")
    done = _wait(run.pk, TERMINAL)
    assert done.status == Status.FAILED and "steps" in done.error
    last = RunEvent.objects.filter(run=run).order_by("-seq").first()
    assert last.data["status"] == "failed"


def test_the_reaper_resumes_or_fails_runs_whose_worker_went_quiet(exp, sim_config):
    from datetime import timedelta

    from django.utils import timezone

    from workers.tasks import reap_stale_runs

    runs = []
    for backend in ("sim", "real"):  # a sim run replays; a real one without checkpoint fails
        run = services.create_run(experiment=exp, config=sim_config, launch=False)
        Run.objects.filter(pk=run.pk).update(backend=backend)
        services.transition(run.pk, Status.STARTING)
        services.transition(run.pk, Status.RUNNING)
        runs.append(run)
    assert reap_stale_runs() == 0  # fresh heartbeats
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    from django.db import transaction

    with transaction.atomic():  # cancelled before this module's worker can relaunch it
        assert reap_stale_runs() == 2
        resumed, failed = (Run.objects.get(pk=r.pk) for r in runs)
        assert resumed.status == Status.QUEUED and resumed.resume_requested
        assert resumed.launches.get(task_id=resumed.celery_task_id)  # through the outbox
        services.request_stop(run=resumed)
    assert failed.status == Status.FAILED and "no checkpoint" in failed.error
    for run, status in ((resumed, "queued"), (failed, "failed")):
        event = RunEvent.objects.get(run=run, kind="run_status", data__status=status)
        assert "stopped heartbeating" in event.data["message"]


@pytest.fixture(scope="module")
def daphne_port(django_db_setup, django_db_blocker):
    """The ASGI app served by a real daphne process on the test database."""
    port = daphne.free_port()
    proc = daphne.start(port)
    yield port
    daphne.stop(proc)


def _events_until_done(client, run_id: int) -> list[dict]:
    got: list[dict] = []
    while True:
        msg = client.recv_json()
        assert msg["type"] in ("subscribed", "events"), msg
        if msg["type"] == "events":
            assert msg["run"] == run_id
            got += msg["events"]
            # gyre_core reports its own end before the worker's final status event: stop
            # only once the run is finished in the database and its last event arrived.
            run = Run.objects.get(pk=run_id)
            if run.status in TERMINAL and got[-1]["seq"] == run.next_seq - 1:
                return got


def test_launch_to_browser_through_daphne_with_reconnect(worker, daphne_port, exp, people,
                                                          sim_config):  # fmt: skip
    from gyre_web.teams.services import create_api_token

    from tests.platform.wsclient import WsClient

    _, key = create_api_token(user=people["viewer"], name="browser")
    run = services.create_run(experiment=exp, config=sim_config)
    client = WsClient("127.0.0.1", daphne_port, f"/ws/?token={key}")
    assert client.status == 101
    client.send_json({"type": "subscribe", "run": run.pk, "after_seq": 0})
    events = _events_until_done(client, run.pk)
    client.close()
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # in order, nothing lost, nothing twice
    assert seqs[-1] == RunEvent.objects.filter(run=run).count()
    assert events[-1]["data"]["status"] == "succeeded"

    again = WsClient("127.0.0.1", daphne_port, f"/ws/?token={key}")
    again.send_json({"type": "subscribe", "run": run.pk, "after_seq": seqs[-4]})
    assert [e["seq"] for e in _events_until_done(again, run.pk)] == seqs[-3:]
    again.close()
