"""Embedded mode, in subprocesses (settings are per process): no DATABASE_URL or REDIS_URL
-> SQLite in the data dir, kombu's filesystem broker, no channel layer. Also the project's
checks: `manage.py check` and `makemigrations --check` (the stdlib `platform` check is in
tests/test_layout.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.platform.conftest import SIM_CONFIG
from tests.platform.test_faults import FAST

ROOT = Path(__file__).resolve().parents[2]


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "DJANGO_SETTINGS_MODULE")}  # fmt: skip
    env.update(GYRE_DATA_DIR=str(data_dir), PYTHONPATH=str(ROOT), **extra)
    return env


def _manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, check=check, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_manage_check_and_migrations_are_complete(tmp_path):
    env = _env(tmp_path)
    assert "no issues" in _manage(env, "check").stdout
    _manage(env, "makemigrations", "--check", "--dry-run")
    key = (tmp_path / "secret_key").read_text()
    _manage(env, "check")
    assert (tmp_path / "secret_key").read_text() == key  # generated once, then kept


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DATABASE_URL", "mysql://x/y", "not supported"),
        ("DATABASE_URL", "postgres://host", "names no database"),
        ("REDIS_URL", "http://x", "not a redis:// URL"),
        ("GYRE_DEBUG", "maybe", "not a boolean"),
        ("GYRE_SECRET_KEY", "short", "at least 32"),
        ("GYRE_EVENT_POLL_SECONDS", "soon", "not a number"),
        ("GYRE_DATASET_MAX_BYTES", "lots", "not a number"),
        ("GYRE_DATASET_MAX_BYTES", "-1", "must not be negative"),
    ],
)
def test_bad_settings_fail_fast_with_a_clear_message(tmp_path, name, value, message):
    result = _manage(_env(tmp_path, **{name: value}), "check", check=False)
    assert result.returncode != 0
    assert message in result.stderr and name in result.stderr


def test_service_mode_requires_a_secret_key(tmp_path):
    env = _env(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:5432/gyre")
    result = _manage(env, "check", check=False)
    assert result.returncode != 0 and "GYRE_SECRET_KEY is required" in result.stderr


@pytest.mark.slow
def test_embedded_mode_runs_a_sim_job_through_the_filesystem_broker(tmp_path):
    env = _env(tmp_path)
    _manage(env, "migrate", "-v", "0")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-P", "solo",
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        flow = ROOT / "tests" / "platform" / "embedded_flow.py"
        code = f"import sys; sys.argv.append({json.dumps(SIM_CONFIG)!r}); exec(open({str(flow)!r}).read())"
        out = _manage(env, "shell", "--no-imports", "-c", code).stdout.strip().splitlines()[-1]
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=30)
    result = json.loads(out)
    assert result["status"] == "succeeded", result["error"]
    assert result["seqs"] == list(range(1, len(result["seqs"]) + 1)) and len(result["seqs"]) > 10
    assert (tmp_path / "gyre.sqlite3").exists()


def _embedded_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "worker",
        "-P",
        "solo",
        "--without-heartbeat",
        "--without-mingle",
        "--without-gossip",
        "-l",
        "INFO",
    ]
    out = open(log, "wb")  # noqa: SIM115 (the child holds it)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True)


def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.slow
def test_embedded_a_killed_worker_s_run_is_reaped_and_resumed(tmp_path):
    """Embedded mode (SQLite, filesystem broker, no beat): the second worker's watchdog
    finds the killed worker's run by its heartbeat and resumes it from its checkpoint."""
    env = _env(tmp_path, **FAST)
    _manage(env, "migrate", "-v", "0")
    config = {**SIM_CONFIG, "steps": 100}
    config["sim"] = {"workload": "xlong", "rollouts": 8000, "gpus": 64, "rollouts_per_step": 20}
    create = (
        "from django.contrib.auth import get_user_model; from gyre_web.runs import services; "
        "from gyre_web.teams.services import create_team; "
        "u = get_user_model().objects.create_user('k'); t = create_team(name='k', owner=u); "
        "e = services.create_experiment(team=t, name='k'); "
        f"print(services.create_run(experiment=e, config={config!r}).pk)"
    )
    db = sqlite3.connect(tmp_path / "gyre.sqlite3", timeout=30)

    def one(sql: str, *args: Any) -> Any:
        return db.execute(sql, args).fetchone()[0]

    workers = [_embedded_worker(env, tmp_path / "first.log")]
    try:
        run_id = int(_manage(env, "shell", "--no-imports", "-c", create).stdout.split()[-1])
        events = "select count(*) from runs_runevent where run_id = ?"
        _until(lambda: one(events, run_id) >= 20, 120, "no events from the first worker")
        workers.append(_embedded_worker(env, tmp_path / "second.log"))
        _until(lambda: b" ready." in (tmp_path / "second.log").read_bytes(), 60, "no worker")
        assert one("select status from runs_run where id = ?", run_id) == "running"
        os.killpg(workers[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        status = "select status from runs_run where id = ?"
        _until(lambda: one(status, run_id) != "running", 60, "the run was not reaped")
        detected_s = time.monotonic() - killed
        _until(lambda: one(status, run_id) in ("succeeded", "failed"), 120, "never ended")
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    rows = db.execute(
        "select seq, kind, data from runs_runevent where run_id = ? order by seq", (run_id,)
    ).fetchall()
    statuses = [json.loads(d)["status"] for _, kind, d in rows if kind == "run_status"]
    assert one(status, run_id) == "succeeded", statuses
    assert statuses.count("queued") == 1 and statuses[-1] == "succeeded", statuses
    assert [s for s, _, _ in rows] == list(range(1, len(rows) + 1))  # nothing lost or doubled
    print(f"\nFAULT embedded worker killed: run reaped in {detected_s:.1f} s, resumed, succeeded")
    assert detected_s < 5 + 15  # the heartbeat timeout, a reaper tick, a loaded machine
