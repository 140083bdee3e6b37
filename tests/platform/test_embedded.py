"""Embedded mode, in subprocesses (settings are per process): no DATABASE_URL or REDIS_URL
-> SQLite in the data dir, kombu's filesystem broker, no channel layer. Also the project's
checks: `manage.py check` and `makemigrations --check` (the stdlib `platform` check is in
tests/test_layout.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.platform.conftest import SIM_CONFIG

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
