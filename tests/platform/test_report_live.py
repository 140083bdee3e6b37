"""A terminal run reporting to a platform that restarts in the middle: ``gyre run
--report-to`` (a real run, its own process) against daphne on the test database, stopped
once the run's first events are in and started again while the run goes on. The
platform's event log equals the run's local event file: nothing lost, nothing twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gyre_web.runs import services
from gyre_web.runs.models import Run, RunEvent
from gyre_web.teams import services as teams

from tests.platform import daphne
from tests.runtime.conftest import TINY_JOB

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _wait(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_platform_restart_loses_and_duplicates_no_event(people, tmp_path: Path) -> None:
    exp = services.create_experiment(team=people["team"], name="from a terminal")
    _, key = teams.create_api_token(user=people["member"], name="terminal")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({**TINY_JOB, "name": "terminal"}))
    local = tmp_path / "events.jsonl"
    port = daphne.free_port()
    server = daphne.start(port)
    env = {**os.environ, "GYRE_TOKEN": key, "RAY_AUTH_MODE": "disabled"}
    run = subprocess.Popen(
        [sys.executable, "-m", "gyre_core.cli.main", "run", str(config),
         "--workdir", str(tmp_path / "run"), "--events", str(local),
         "--report-to", f"http://127.0.0.1:{port}", "--experiment", str(exp.pk)],
        cwd=daphne.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait(lambda: RunEvent.objects.filter(run__experiment=exp).exists(), 120, "no event")
        daphne.stop(server)  # the platform goes away mid-run...
        time.sleep(3)
        server = daphne.start(port)  # ...and comes back on the same address
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
        daphne.stop(server)
    assert run.returncode == 0, err.decode()[-2000:]
    assert b"platform unreachable" in err  # the run saw the platform go
    mine = [json.loads(line) for line in local.read_text().splitlines()]
    reported = Run.objects.get(experiment=exp)
    stored = list(RunEvent.objects.filter(run=reported).order_by("seq"))
    assert [(e.kind, e.t) for e in stored] == [(e["kind"], e["t"]) for e in mine]
    # a step's trajectory file is stored by its name, never the (reporter's) folder
    for event in mine:
        if event["kind"] == "rollouts_written":
            event["data"]["path"] = Path(event["data"]["path"]).name
    assert [e.data for e in stored] == [e["data"] for e in mine]
    assert reported.status == "succeeded" and reported.source == "reported"
    assert reported.reported_seq == len(mine)


def test_a_cancel_from_the_web_stops_the_terminal_run(people, tmp_path: Path) -> None:
    exp = services.create_experiment(team=people["team"], name="cancelled from the web")
    _, key = teams.create_api_token(user=people["member"], name="terminal")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({**TINY_JOB, "name": "long", "steps": 50}))
    port = daphne.free_port()
    server = daphne.start(port)
    env = {**os.environ, "GYRE_TOKEN": key, "RAY_AUTH_MODE": "disabled"}
    run = subprocess.Popen(
        [sys.executable, "-m", "gyre_core.cli.main", "run", str(config), "--json",
         "--workdir", str(tmp_path / "run"),
         "--report-to", f"http://127.0.0.1:{port}", "--experiment", str(exp.pk)],
        cwd=daphne.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        steps = RunEvent.objects.filter(run__experiment=exp, kind="step_finished")
        _wait(steps.exists, 180, "no step finished")
        services.request_stop(run=Run.objects.get(experiment=exp))
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
        daphne.stop(server)
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["status"] == "cancelled", err.decode()[-2000:]
    reported = Run.objects.get(experiment=exp)
    assert reported.status == "cancelled" and reported.step < 50
