"""Two deployments, two Postgres databases, one Redis database: each launch message carries
its deployment's key, and a worker of the other deployment puts it back on the queue
(never acknowledged as done), logs an error and records it, so the launch reaches its own
deployment's worker and the other deployment's ``readyz`` says the broker is shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection
from gyre_web.cluster.deployments import deployment_key
from gyre_web.runs import services
from gyre_web.runs.models import Run, Status

from tests.platform import daphne

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
B_KEY = "b" * 32


def _url(name: str) -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{name}"


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(_url("postgres"), autocommit=True)


@pytest.fixture
def other_db(django_db_setup, tmp_path: Path) -> Iterator[str]:
    """Deployment B's database: migrated afresh (a template copy would need every other
    session on this one closed, which a full suite's lingering threads do not promise),
    with a key of its own."""
    other = f"{connection.settings_dict['NAME']}_b"
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{other}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, env=_env(other, tmp_path / "b"), check=True, timeout=300,
    )  # fmt: skip
    with psycopg.connect(_url(other), autocommit=True) as b:
        b.execute("UPDATE cluster_deployment SET key = %s", [B_KEY])
    yield other
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')


def _env(db: str, data: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DATABASE_URL=_url(db), PYTHONPATH=str(ROOT), GYRE_DATA_DIR=str(data))
    return env


def _worker(db: str, data: Path, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-P", "solo",
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO"],
        cwd=ROOT, env=_env(db, data), stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    _wait_for(lambda: "ready." in log.read_text(errors="replace"), 60, f"{log.name} not ready")
    return proc


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _seen_by_b(other: str) -> tuple[Any, ...] | None:
    with psycopg.connect(_url(other)) as b:
        return b.execute(
            "SELECT other_key, other_run_id FROM cluster_deployment WHERE other_seen_at IS NOT NULL"
        ).fetchone()


def test_a_launch_reaching_another_deployment_s_worker_goes_to_its_own(
    other_db, people, sim_config, tmp_path
):
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    procs = []
    try:
        procs.append(_worker(other_db, tmp_path / "b", tmp_path / "worker-b.log"))
        exp = services.create_experiment(team=people["team"], name="shared")
        run = services.create_run(experiment=exp, config=sim_config)  # sent on commit
        _wait_for(lambda: _seen_by_b(other_db), 30, "B's worker recorded no foreign launch")
        assert _seen_by_b(other_db) == (deployment_key(), run.pk)
        time.sleep(1.5)  # B's worker has had it at least once: still nobody's run
        assert Run.objects.get(pk=run.pk).status == Status.QUEUED
        log_b = (tmp_path / "worker-b.log").read_text(errors="replace")
        assert f"launch of run {run.pk} belongs to deployment {deployment_key()}" in log_b
        assert "skipped" not in log_b  # never acknowledged as done
        # A's own worker comes up and gets the launch that B's kept putting back.
        procs.append(_worker(connection.settings_dict["NAME"], tmp_path / "a", tmp_path / "a.log"))
        _wait_for(
            lambda: Run.objects.get(pk=run.pk).status == Status.SUCCEEDED, 90, "A's run not run"
        )
        ready = subprocess.run(
            [sys.executable, "-c", READYZ], cwd=ROOT, env=_env(other_db, tmp_path / "b"),
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        answer = json.loads(ready.stdout.strip().splitlines()[-1])
        assert answer["status"] == "ready" and len(answer["warnings"]) == 1, answer
        assert (
            deployment_key() in answer["warnings"][0]
            and "shares this broker" in answer["warnings"][0]
        )
    finally:
        for proc in procs:
            daphne.stop(proc)


READYZ = """
import os, sys
sys.path.insert(0, "platform")
os.environ["DJANGO_SETTINGS_MODULE"] = "gyre_web.settings"
import django
django.setup()
from django.test import Client
print(Client().get("/readyz", HTTP_HOST="localhost").content.decode())
"""


@pytest.mark.django_db(transaction=False)
def test_foreign_and_keyless_launches_are_refused_and_reported(people, sim_config, client):
    from gyre_web.cluster.services import foreign_launch

    exp = services.create_experiment(team=people["team"], name="keys")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    assert foreign_launch(run_id=run.pk, sender=deployment_key()) == ""
    assert foreign_launch(run_id=run.pk, sender="") == ""  # sent before keys: its run is here
    assert client.get("/readyz", HTTP_HOST="localhost").json()["warnings"] == []
    assert "gyre_shared_broker 0" in client.get("/metrics", HTTP_HOST="localhost").content.decode()
    assert "no such run" in foreign_launch(run_id=run.pk + 1000, sender="")
    assert "belongs to deployment " + B_KEY in foreign_launch(run_id=run.pk, sender=B_KEY)
    warnings = client.get("/readyz", HTTP_HOST="localhost").json()["warnings"]
    assert len(warnings) == 1 and B_KEY in warnings[0], warnings
    assert "gyre_shared_broker 1" in client.get("/metrics", HTTP_HOST="localhost").content.decode()
