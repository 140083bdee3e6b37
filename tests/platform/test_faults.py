"""Faults, with real processes on the test database and a private ``redis-server`` (a
spare port from 6391, started, stopped and restarted here; the machine's shared Redis is
never touched). It is both the Celery broker and the channel layer of the workers and
daphne started here, and this process sends its launches to it too.

(a) a worker killed mid-run: another worker's watchdog finds the heartbeat stale and the
    run resumes and succeeds; (b) Redis stopped and restarted under a subscribed socket:
    the run goes on, the socket stays open and delivers every event once; (c) the launch
    outbox under a broker outage: POST answers 201, the run is launched exactly once.

Each test prints its figure (``FAULT ...``; run with ``-s`` to see them)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection
from django.utils import timezone
from gyre_web.runs import services
from gyre_web.runs.models import LaunchOutbox, Run, RunEvent, Status

from tests.platform.wsclient import WsClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TERMINAL = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PAUSED}
# Small lifecycle timeouts for the processes started here (the defaults: 5, 60, 15, 5 s).
FAST = {
    "GYRE_HEARTBEAT_SECONDS": "0.5",
    "GYRE_HEARTBEAT_TIMEOUT_SECONDS": "5",
    "GYRE_REAPER_SECONDS": "1",
    "GYRE_OUTBOX_RETRY_SECONDS": "1",
}


def _free_port(start: int = 6391) -> int:
    for port in range(start, start + 50):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no spare port for a private redis-server")


class RedisServer:
    """A private redis-server without persistence: a restart loses every key (queued
    messages, channel-layer groups), the hardest case for what depends on it."""

    def __init__(self, port: int, folder: Path) -> None:
        self.port, self.folder = port, folder
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = f"--port {self.port} --bind 127.0.0.1 --appendonly no --dir {self.folder}"
        cmd = ["redis-server", *args.split(), "--save", ""]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        _wait_for(lambda: _pings(client), 10, "redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory, django_db_setup) -> Iterator[RedisServer]:
    """The private Redis, and this process's launches sent to it (the platform's queue
    client's broker URL changed and its connection pools dropped, restored afterwards)."""
    from gyre_web.queue import client

    app = client()
    server = RedisServer(_free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    saved = app.conf.broker_url
    app.conf.broker_url = server.url
    app._after_fork()  # drop the pools bound to the shared broker
    try:
        yield server
    finally:
        server.stop()
        app.conf.broker_url = saved
        app._after_fork()


def _env(server: RedisServer, **extra: str) -> dict[str, str]:
    db = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        REDIS_URL=server.url,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'platform'}",
        **FAST,
        **extra,
    )
    return env


@contextlib.contextmanager
def _processes() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(
        cmd: list[str], env: dict[str, str], log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        out = open(log, "wb") if log is not None else None  # noqa: SIM115 (the child holds it)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stderr=out)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)


CELERY = "celery -A workers.celery_app worker -P solo --without-heartbeat --without-mingle"
WORKER = [sys.executable, "-m", *CELERY.split(), "--without-gossip", "-l", "INFO"]


def _ready(log: Path) -> None:
    _wait_for(lambda: b" ready." in log.read_bytes(), 60, f"the worker did not start ({log})")


def _long_sim(sim_config: dict[str, Any], steps: int) -> dict[str, Any]:
    sim_config.update(steps=steps)
    sim_config["sim"] = {"workload": "xlong", "rollouts": 8000, "gpus": 64, "rollouts_per_step": 20}
    return sim_config


def _wait_run(run_id: int, until: set[str], timeout: float) -> Run:
    _wait_for(
        lambda: Run.objects.get(pk=run_id).status in until,
        timeout,
        f"run {run_id} never reached {until}",
    )
    return Run.objects.get(pk=run_id)


def _statuses(run: Run) -> list[tuple[str, str]]:
    rows = RunEvent.objects.filter(run=run, kind="run_status").order_by("seq")
    return [(e.data["status"], e.data.get("message", "")) for e in rows]


def test_a_worker_killed_mid_run_is_detected_and_its_run_resumes(
    private_redis, people, sim_config, tmp_path
):
    exp = services.create_experiment(team=people["team"], name="killed")
    with _processes() as start:
        first = start(WORKER, _env(private_redis), log=tmp_path / "first.log")
        _ready(tmp_path / "first.log")
        run = services.create_run(experiment=exp, config=_long_sim(sim_config, 100))
        _wait_for(lambda: RunEvent.objects.filter(run=run).count() >= 20, 60, "no events")
        second = start(WORKER, _env(private_redis), log=tmp_path / "second.log")
        _ready(tmp_path / "second.log")  # idle: its watchdog will find the dead worker
        assert Run.objects.get(pk=run.pk).status == Status.RUNNING, "the run ended too soon"
        os.killpg(first.pid, signal.SIGKILL)  # no ack, no final status, no heartbeat
        killed_at = timezone.now()
        requeued = RunEvent.objects.filter(run=run, kind="run_status", data__status="queued")
        _wait_for(requeued.exists, 60, "the dead worker's run was not reaped")
        detected_s = (_wall(requeued.get().wall) - killed_at).total_seconds()
        done = _wait_run(run.pk, TERMINAL, 90)
        assert second.poll() is None
    assert done.status == Status.SUCCEEDED, done.error
    statuses = _statuses(done)
    assert statuses[0] == ("running", "started") and statuses[-1][0] == "succeeded", statuses
    queued = [m for s, m in statuses if s == "queued"]
    assert len(queued) == 1 and "stopped heartbeating" in queued[0], statuses
    assert [m for _, m in statuses].count("resumed") == 1, statuses
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    print(
        f"\nFAULT worker killed: detected in {detected_s:.1f} s (heartbeat timeout "
        f"{FAST['GYRE_HEARTBEAT_TIMEOUT_SECONDS']} s), run resumed and succeeded"
    )
    assert detected_s < 5 + 10  # the timeout, plus a reaper tick and a loaded machine


def _wall(value: datetime) -> datetime:
    return value if value.tzinfo else timezone.make_aware(value)


def _daphne(start: Callable[..., subprocess.Popen[bytes]], env: dict[str, str], log: Path) -> int:
    port = _free_port(18400)
    cmd = [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "gyre_web.asgi:application",
    ]
    proc = start(cmd, env, log)

    def up() -> bool:
        assert proc.poll() is None, "daphne exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    _wait_for(up, 60, "daphne did not start")
    return port


def test_redis_restarted_under_a_subscribed_socket_loses_no_event(
    private_redis, people, sim_config, tmp_path
):
    from gyre_web.teams.services import create_api_token

    _, key = create_api_token(user=people["viewer"], name="faults")
    exp = services.create_experiment(team=people["team"], name="outage")
    got: list[int] = []
    outage: dict[str, float] = {}

    def cut_redis() -> None:  # stop Redis once events flow, start it again 4 s later
        _wait_for(lambda: len(got) >= 50, 60, "no events before the outage")
        private_redis.stop()
        outage["before"] = len(got)
        time.sleep(4)
        outage["during"] = len(got) - outage["before"]
        private_redis.start()
        outage["after"] = len(got)

    with _processes() as start:
        start(WORKER, _env(private_redis), log=tmp_path / "worker.log")
        port = _daphne(start, _env(private_redis), tmp_path / "daphne.log")
        run = services.create_run(experiment=exp, config=_long_sim(sim_config, 160))
        client = WsClient("127.0.0.1", port, f"/ws/?token={key}", timeout=30)
        assert client.status == 101
        client.send_json({"type": "subscribe", "run": run.pk, "after": 0})
        cutter = threading.Thread(target=cut_redis)
        cutter.start()
        while True:  # one socket throughout: a drop fails the test (ConnectionError)
            msg = client.recv_json()
            assert msg["type"] in ("subscribed", "events"), msg
            got += [e["seq"] for e in msg.get("events", [])]
            done = Run.objects.get(pk=run.pk)
            if done.status in TERMINAL and got and got[-1] == done.next_seq - 1:
                break
        cutter.join(timeout=30)
        client.close()
    assert done.status == Status.SUCCEEDED, done.error
    assert outage.get("during", 0) > 0, outage  # delivered from the table meanwhile
    assert len(got) > outage["after"], outage  # and after Redis came back
    log = (tmp_path / "daphne.log").read_text()
    # wake-ups resume: the run's group and the access notices' group are joined again
    assert "redis unreachable" in log and re.search(r"[1-9]\d* groups joined again", log)
    assert got == list(range(1, done.next_seq))  # every event, in order, exactly once
    lost = done.next_seq - 1 - len(set(got))
    print(
        f"\nFAULT redis restarted: {len(got)} events, {outage['during']} delivered during "
        f"the 4 s outage, events lost: {lost}, duplicated: {len(got) - len(set(got))}"
    )


def test_a_launch_during_a_broker_outage_is_sent_later_exactly_once(
    private_redis, people, client_for, sim_config, settings, tmp_path
):
    exp = services.create_experiment(team=people["team"], name="outbox")
    private_redis.stop()
    try:
        asked = time.monotonic()
        response = client_for(people["member"]).post(
            "/api/runs/", {"experiment": exp.pk, "config": sim_config}, format="json"
        )
        answered_s = time.monotonic() - asked
    finally:
        private_redis.start()
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "queued"
    run = Run.objects.get(pk=response.json()["id"])
    row = LaunchOutbox.objects.get(run=run)
    assert row.task_id == run.celery_task_id and row.sent_at is None
    assert row.attempts == 1 and row.last_error

    # The broker is back. Two dispatcher passes: the first sends the row, the second
    # (a re-send, as for a message the broker lost) sends the same launch again.
    settings.GYRE_OUTBOX_RETRY_SECONDS = 0
    settings.GYRE_LAUNCH_RESEND_SECONDS = 0
    assert services.dispatch_launches() == 1
    assert services.dispatch_launches() == 1
    row.refresh_from_db()
    assert row.attempts == 3 and row.sent_at is not None
    queue = redis.Redis.from_url(private_redis.url)
    assert queue.llen("celery") == 2  # two messages, one launch

    with _processes() as start:
        start(WORKER, _env(private_redis), log=tmp_path / "worker.log")
        done = _wait_run(run.pk, TERMINAL, 60)
        _wait_for(lambda: queue.llen("celery") == 0, 30, "a launch message was not consumed")
        time.sleep(1.0)  # the second message is taken and skipped: nothing more happens
        assert services.dispatch_launches() == 0  # the run is no longer queued
    assert done.status == Status.SUCCEEDED, done.error
    statuses = _statuses(done)  # one claim: "started" once, never "resumed" or queued again
    assert statuses[0] == ("running", "started") and statuses[-1][0] == "succeeded", statuses
    assert [m for _, m in statuses].count("started") == 1, statuses
    assert not [m for s, m in statuses if m == "resumed" or s == "queued"], statuses
    print(
        f"\nFAULT broker down at launch: POST answered 201 in {answered_s:.2f} s; "
        f"3 send attempts, 2 messages, 1 launch"
    )
