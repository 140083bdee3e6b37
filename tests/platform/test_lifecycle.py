"""The run status machine's worker side, on the database alone (no broker: launches stay
in the outbox, which sends on commit): a redelivered launch under a fresh heartbeat is
skipped and the reaper takes the run over once the heartbeat is stale; a cancel of a run
whose worker is gone ends it at once, and it can then be deleted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from gyre_web.runs import services
from gyre_web.runs.models import Run, RunEvent, Status

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="life")
    run = services.create_run(experiment=exp, config=sim_config)
    claimed = services.claim_launch(run_id=run.pk, task_id=run.celery_task_id)
    assert claimed is not None and claimed[1] is False  # first delivery: a fresh start
    services.transition(run.pk, Status.RUNNING)
    return Run.objects.get(pk=run.pk)


def _quiet(run: Run, seconds: float) -> None:
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_a_redelivery_under_a_fresh_heartbeat_is_skipped_and_the_reaper_takes_over(running):
    first_task = running.celery_task_id
    # The message arrives again while its worker heartbeats: skipped, nothing launched.
    assert services.claim_launch(run_id=running.pk, task_id=first_task) is None
    assert services.heartbeat_launch(run_id=running.pk, task_id=first_task)
    assert services.reap_stale_runs() == []
    # That worker dies: its heartbeat goes stale and the reaper relaunches the run.
    _quiet(running, 3600)
    assert services.reap_stale_runs() == [running.pk]
    run = Run.objects.get(pk=running.pk)
    assert run.status == Status.QUEUED and run.resume_requested
    assert run.celery_task_id != first_task
    assert run.launches.get(task_id=run.celery_task_id).sent_at is None  # sent on commit
    assert not services.heartbeat_launch(run_id=run.pk, task_id=first_task)
    # The old message, should the broker deliver it now, no longer owns the run.
    assert services.claim_launch(run_id=run.pk, task_id=first_task) is None
    claimed = services.claim_launch(run_id=run.pk, task_id=run.celery_task_id)
    assert claimed is not None and claimed[1] is True  # the new launch resumes it
    event = RunEvent.objects.get(run=run, kind="run_status")
    assert event.data["status"] == "queued" and "resuming" in event.data["message"]


def test_a_stale_redelivery_takes_the_run_over_and_holds_it(running, settings):
    _quiet(running, settings.GYRE_TAKEOVER_SECONDS + 1)
    claimed = services.claim_launch(run_id=running.pk, task_id=running.celery_task_id)
    assert claimed is not None and claimed[1] is True
    assert services.reap_stale_runs() == []  # the takeover's heartbeat is fresh


def test_the_reaper_stops_resuming_a_run_that_keeps_losing_its_worker(running, settings):
    settings.GYRE_REAPER_MAX_RESUMES = 1
    _quiet(running, 3600)
    assert services.reap_stale_runs() == [running.pk]
    run = Run.objects.get(pk=running.pk)
    services.claim_launch(run_id=run.pk, task_id=run.celery_task_id)
    _quiet(run, 3600)
    assert services.reap_stale_runs() == [run.pk]
    run.refresh_from_db()
    assert run.status == Status.FAILED and "resumed 1 times already" in run.error


def test_cancel_of_a_run_whose_worker_is_gone_ends_it_at_once(running, people, client_for):
    client = client_for(people["member"])
    _quiet(running, 10)  # a live worker: the request waits for its next poll
    assert client.post(f"/api/runs/{running.pk}/cancel/").status_code == 200
    assert Run.objects.get(pk=running.pk).status == Status.RUNNING
    assert client.delete(f"/api/runs/{running.pk}/").status_code == 400
    _quiet(running, 3600)  # the worker is gone: nobody would read the request
    response = client.post(f"/api/runs/{running.pk}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    event = RunEvent.objects.filter(run=running).order_by("-seq").first()
    assert event.data["status"] == "cancelled" and "worker is gone" in event.data["message"]
    assert client.delete(f"/api/runs/{running.pk}/").status_code == 204


@pytest.mark.parametrize(
    ("mode", "final"), [("cancel", Status.CANCELLED), ("pause", Status.PAUSED)]
)
def test_a_stop_sent_while_the_worker_dies_is_honoured_by_the_reaper(
    running, people, client_for, mode, final
):
    client = client_for(people["member"])
    _quiet(running, 10)  # a live worker: the request waits for its next poll
    assert client.post(f"/api/runs/{running.pk}/{mode}/").status_code == 200
    assert Run.objects.get(pk=running.pk).stop_requested == mode
    _quiet(running, 3600)  # ... which never comes: the worker died
    assert services.reap_stale_runs() == [running.pk]
    run = Run.objects.get(pk=running.pk)
    assert (run.status, run.stop_requested, run.resume_requested) == (final, "", False)
    assert run.launches.count() == 1  # no resume was queued
    event = RunEvent.objects.get(run=run, kind="run_status")
    assert event.data["status"] == final and "stopped heartbeating" in event.data["message"]


def test_a_redelivery_of_a_run_asked_to_stop_stops_it_instead_of_running_it(
    running, people, client_for, settings
):
    client = client_for(people["member"])
    assert client.post(f"/api/runs/{running.pk}/cancel/").status_code == 200
    _quiet(running, settings.GYRE_TAKEOVER_SECONDS + 1)  # quiet, not yet reaped
    assert services.claim_launch(run_id=running.pk, task_id=running.celery_task_id) is None
    run = Run.objects.get(pk=running.pk)
    assert (run.status, run.stop_requested) == (Status.CANCELLED, "")
