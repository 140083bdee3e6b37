"""A worker killed mid-run: the launch message is redelivered (acks_late, a short broker
visibility timeout here), a second worker takes the quiet run over and resumes it; the
event log stays contiguous and rollouts are not duplicated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection
from gyre_web.runs import services
from gyre_web.runs.models import Run, RunEvent, Status
from gyre_web.trajectories.models import Rollout

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _start_worker() -> subprocess.Popen:
    db = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        PYTHONPATH=str(ROOT),
        GYRE_BROKER_VISIBILITY_TIMEOUT="3",
        GYRE_TAKEOVER_SECONDS="1",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-P", "solo",
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"],
        cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_killed_worker_s_run_is_redelivered_and_resumed(people, sim_config):
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    exp = services.create_experiment(team=people["team"], name="redelivery")
    sim_config.update(steps=400)
    sim_config["sim"] = {
        "workload": "xlong",
        "rollouts": 8000,
        "gpus": 64,
        "rollouts_per_step": 20,
    }  # fmt: skip  — about a minute of work
    first = _start_worker()
    second = None
    try:
        run = services.create_run(experiment=exp, config=sim_config)
        _wait_for(lambda: RunEvent.objects.filter(run=run).count() >= 20, 60, "no events")
        os.killpg(first.pid, signal.SIGKILL)  # the worker dies without acknowledging
        first.wait(timeout=30)
        killed_at = RunEvent.objects.filter(run=run).count()
        assert Run.objects.get(pk=run.pk).status == Status.RUNNING
        second = _start_worker()
        resumed = RunEvent.objects.filter(run=run, kind="run_status", data__message="resumed")
        _wait_for(resumed.exists, 60, "the run was not taken over")
        _wait_for(lambda: RunEvent.objects.filter(run=run).count() > killed_at + 20, 60,
                  "no progress after the takeover")  # fmt: skip
        services.request_stop(run=Run.objects.get(pk=run.pk))
        _wait_for(lambda: Run.objects.get(pk=run.pk).status == Status.CANCELLED, 30, "no stop")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    started = RunEvent.objects.filter(run=run, kind="rollout_started")
    ids = {e.data["rollout_id"] for e in started}
    assert Rollout.objects.filter(run=run).count() == len(ids)  # replayed, not duplicated
