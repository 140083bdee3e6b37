"""A run's log lines: a sim run launched by a real Celery worker stores the worker's and
the runtime's lines; GET /api/runs/{id}/logs/ searches them, filters by level and source,
pages by seq and gives the tail; NUL is made visible, long lines are cut and a run keeps
at most GYRE_RUN_LOG_MAX_LINES lines."""

from __future__ import annotations

import pytest
from django.test import override_settings
from gyre_web.runs import services
from gyre_web.runs.logs import MAX_LINE_CHARS, append_log_lines
from gyre_web.runs.models import RunLogLine, Status
from gyre_web.teams import services as teams

from tests.platform.test_workers import TERMINAL, _wait, worker  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True)]


def _logs(client, run_id, **params):
    got = client.get(f"/api/runs/{run_id}/logs/", params)
    assert got.status_code == 200, got.content
    return got.json()


@pytest.mark.slow
def test_a_launched_sim_run_stores_worker_and_runtime_lines(worker, people, client_for, sim_config):  # noqa: F811
    exp = services.create_experiment(team=people["team"], name="logs")
    run = services.create_run(experiment=exp, config=sim_config)
    done = _wait(run.pk, TERMINAL)
    assert done.status == Status.SUCCEEDED, done.error
    viewer = client_for(people["viewer"])
    page = _logs(viewer, run.pk)
    lines = page["lines"]
    assert [x["seq"] for x in lines] == list(range(1, len(lines) + 1))
    assert page["last_seq"] == len(lines)
    texts = {(x["source"], x["text"]) for x in lines}
    assert ("worker", f"run {run.pk} started at step 0 (task {done.celery_task_id})") in texts
    assert ("worker", f"run {run.pk} succeeded at step 2") in texts
    assert any(
        s == "runtime" and t.startswith("sim: 16 uniform rollouts on 16 GPUs") for s, t in texts
    )

    found = _logs(viewer, run.pk, q="UNIFORM ROLLOUTS")["lines"]
    assert [x["source"] for x in found] == ["runtime"]
    assert _logs(viewer, run.pk, source="worker")["lines"] == [
        x for x in lines if x["source"] == "worker"
    ]
    assert _logs(viewer, run.pk, level="warning")["lines"] == []

    _, key = teams.create_share_link(created_by=people["owner"], run=run)
    shared = client_for().get(f"/api/runs/{run.pk}/logs/", HTTP_X_GYRE_SHARE=key)
    assert shared.status_code == 200 and shared.json()["lines"] == lines
    assert client_for(people["outsider"]).get(f"/api/runs/{run.pk}/logs/").status_code == 404


@pytest.mark.slow
def test_a_failing_run_logs_its_error(worker, people, client_for, sim_config):  # noqa: F811
    from gyre_web.runs.models import Run

    from workers.celery_app import app

    exp = services.create_experiment(team=people["team"], name="fails")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    Run.objects.filter(pk=run.pk).update(config={**sim_config, "steps": 0}, celery_task_id="t-9")
    app.send_task("workers.tasks.launch_run", args=[run.pk], task_id="t-9")
    assert _wait(run.pk, TERMINAL).status == Status.FAILED
    errors = _logs(client_for(people["member"]), run.pk, level="error")["lines"]
    assert errors and all(x["level"] == "error" for x in errors)
    assert any("steps" in x["text"] for x in errors)


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="lines")
    return services.create_run(experiment=exp, config=sim_config, launch=False)


def test_levels_search_paging_nul_and_length(run, people, client_for):
    append_log_lines(
        run_id=run.pk,
        lines=[
            {"source": "runtime", "level": "debug", "text": "tokenizer loaded"},
            {"source": "runtime", "level": "info", "text": "step 1 done\n"},
            {"source": "worker", "level": "warning", "text": "slow\x00disk"},
            {"source": "runtime", "level": "error", "text": "x" * (MAX_LINE_CHARS + 50)},
        ],
    )
    client = client_for(people["member"])
    lines = _logs(client, run.pk)["lines"]
    assert [x["text"] for x in lines[:3]] == ["tokenizer loaded", "step 1 done", "slow\u2400disk"]
    assert len(lines[3]["text"]) == MAX_LINE_CHARS and lines[3]["text"].endswith("…")
    assert [x["level"] for x in _logs(client, run.pk, level="warning")["lines"]] == [
        "warning",
        "error",
    ]
    assert [x["seq"] for x in _logs(client, run.pk, level="info")["lines"]] == [2, 3, 4]
    assert [x["seq"] for x in _logs(client, run.pk, q="DISK")["lines"]] == [3]
    assert [x["seq"] for x in _logs(client, run.pk, after=2, limit=1)["lines"]] == [3]
    assert [x["seq"] for x in _logs(client, run.pk, tail="true", limit=2)["lines"]] == [3, 4]
    for bad in ({"level": "loud"}, {"after": "-1"}, {"limit": "0"}, {"source": "x"},
                {"q": "a" * 201}, {"tail": "maybe"}):  # fmt: skip
        got = client.get(f"/api/runs/{run.pk}/logs/", bad)
        assert got.status_code == 400 and set(got.json()) == set(bad), (bad, got.content)


@override_settings(GYRE_RUN_LOG_MAX_LINES=5)
def test_a_run_keeps_at_most_its_limit_of_lines(run):
    more = [{"source": "runtime", "level": "info", "text": f"line {i}"} for i in range(4)]
    append_log_lines(run_id=run.pk, lines=more)
    append_log_lines(run_id=run.pk, lines=more)
    assert append_log_lines(run_id=run.pk, lines=more) == []
    texts = list(RunLogLine.objects.filter(run=run).order_by("seq").values_list("text", flat=True))
    assert texts[:4] == [f"line {i}" for i in range(4)] and len(texts) == 5
    assert texts[4].startswith("log limit reached (5 lines")


def test_a_reported_run_logs_its_phases_and_statuses_once(people, client_for, sim_config):
    from gyre_core.events import PhaseProgress, RunStatus

    exp = services.create_experiment(team=people["team"], name="terminal")
    client = client_for(people["member"])
    made = client.post(
        "/api/runs/report/", {"experiment": exp.pk, "config": sim_config}, format="json"
    )
    run_id = made.json()["id"]
    events = [
        RunStatus(t=0.0, status="running", step=0, message="started").to_json(),
        PhaseProgress(t=1.0, phase="warm start", done=2, total=4, message="loss 0.4").to_json(),
        RunStatus(t=2.0, status="failed", step=0, message="out of memory").to_json(),
    ]
    url = f"/api/runs/{run_id}/report-events/"
    for _ in range(2):  # the second batch is the first sent again: stored once
        assert client.post(url, {"first": 1, "events": events}, format="json").status_code == 200
    lines = _logs(client, run_id)["lines"]
    assert [(x["source"], x["level"], x["text"]) for x in lines] == [
        ("runtime", "info", "run running at step 0: started"),
        ("runtime", "info", "warm start 2/4, loss 0.4"),
        ("runtime", "error", "run failed at step 0: out of memory"),
    ]


def test_the_shipper_takes_the_task_thread_and_the_runtime_but_not_other_threads(run):
    import logging
    import threading
    import warnings

    from workers.logship import LogShipper

    shipper = LogShipper(run.pk, interval=0.05).start()
    try:
        logging.getLogger("workers.tasks").info("task line")
        logging.getLogger("workers.tasks").debug("too fine")
        other = threading.Thread(
            target=lambda: (
                logging.getLogger("gyre_web.runs.services").warning("run 999: reaped"),
                logging.getLogger("gyre_core.runtime.loop").info("from a runtime thread"),
            )
        )
        other.start()
        other.join()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("careful\x00now", UserWarning, stacklevel=1)
    finally:
        shipper.close()
    got = list(
        RunLogLine.objects.filter(run=run).order_by("seq").values_list("source", "level", "text")
    )
    assert got[:2] == [
        ("worker", "info", "task line"),
        ("runtime", "info", "from a runtime thread"),
    ]
    assert len(got) == 3 and got[2][:2] == ("runtime", "warning")
    assert "UserWarning: careful\u2400now" in got[2][2]
