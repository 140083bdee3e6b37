"""Runs that report from elsewhere: created running, their numbered batches stored once
and in order, bad events refused by field, a stop from the web in every answer, never
reaped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from gyre_web.runs import services
from gyre_web.runs.models import MetricPoint, Run

from gyre_core.events import RunStatus, StepFinished

pytestmark = pytest.mark.django_db


def _step(step: int) -> dict[str, Any]:
    return StepFinished(
        t=float(step), step=step, version=step, metrics={"loss": 1.0 / step}
    ).to_json()


@pytest.fixture
def reported(people, sim_config, client_for):
    exp = services.create_experiment(team=people["team"], name="terminal")
    client = client_for(people["member"])
    r = client.post(
        "/api/runs/report/",
        {"experiment": exp.pk, "config": sim_config, "name": "t"},
        format="json",
    )
    assert r.status_code == 201, r.json()
    return client, r.json()["id"]


def _send(client, run_id: int, first: int, events: list[dict[str, Any]]):
    return client.post(
        f"/api/runs/{run_id}/report-events/", {"first": first, "events": events}, format="json"
    )


def test_batches_are_stored_once_and_in_order(reported) -> None:
    client, run_id = reported
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.source) == ("running", "reported")
    steps = [_step(i) for i in range(1, 6)]
    assert _send(client, run_id, 1, steps[:3]).json() == {"stored": 3, "next": 4, "stop": ""}
    assert _send(client, run_id, 1, steps[:3]).json()["stored"] == 0  # its answer was lost
    gap = _send(client, run_id, 5, steps[4:])
    assert gap.status_code == 409 and gap.json()["expected"] == 4
    assert _send(client, run_id, 3, steps[2:]).json() == {"stored": 2, "next": 6, "stop": ""}
    events = client.get(f"/api/runs/{run_id}/events/").json()["events"]
    assert [e["data"]["step"] for e in events if e["kind"] == "step_finished"] == [1, 2, 3, 4, 5]
    assert MetricPoint.objects.filter(run_id=run_id, name="loss").count() == 5
    assert Run.objects.get(pk=run_id).step == 5


def test_a_bad_event_is_refused_by_its_field(reported) -> None:
    client, run_id = reported
    bad = {"kind": "step_finished", "t": 1.0, "data": {"step": "one", "version": 1, "metrics": {}}}
    r = _send(client, run_id, 1, [_step(1), bad])
    assert r.status_code == 400 and r.json()["field"] == "events[1]"
    assert "data.step" in r.json()["detail"]
    unknown = _send(client, run_id, 1, [{"kind": "nope", "t": 0.0, "data": {}}])
    assert unknown.status_code == 400 and "unknown kind" in unknown.json()["detail"]
    assert _send(client, run_id, 0, [_step(1)]).status_code == 400  # first counts from 1
    assert Run.objects.get(pk=run_id).reported_seq == 0  # nothing of a refused batch


def test_a_cancel_from_the_web_reaches_the_reporter_and_its_status_ends_the_run(
    reported,
) -> None:
    client, run_id = reported
    assert client.post(f"/api/runs/{run_id}/cancel/").status_code == 200
    answer = _send(client, run_id, 1, [_step(1)]).json()
    assert answer["stop"] == "cancel"
    end = RunStatus(t=2.0, status="cancelled", step=1, message="cancelled by user").to_json()
    assert _send(client, run_id, 2, [end]).json()["stored"] == 1
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.finished_at is not None
    late = _send(client, run_id, 3, [_step(2)])
    assert late.status_code == 409 and late.json()["field"] == "run"


def test_a_failed_status_keeps_its_message(reported) -> None:
    client, run_id = reported
    end = RunStatus(t=1.0, status="failed", step=0, message="OSError: disk full").to_json()
    _send(client, run_id, 1, [end])
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and run.error == "OSError: disk full"


def test_a_launched_run_takes_no_reported_events(people, sim_config, client_for) -> None:
    exp = services.create_experiment(team=people["team"], name="launched")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    r = _send(client_for(people["member"]), run.pk, 1, [_step(1)])
    assert r.status_code == 409 and r.json()["field"] == "run"


def test_a_silent_reported_run_is_never_reaped(reported) -> None:
    _, run_id = reported
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(days=1))
    assert run_id not in services.reap_stale_runs()
    assert Run.objects.get(pk=run_id).status == "running"


def test_sys_metrics_are_stored_and_served_by_kind(reported) -> None:
    from gyre_core.events import SysMetrics

    client, run_id = reported
    gpu = {"util_pct": 87.5, "mem_mb": 40960.0, "mem_total_mb": 81920.0, "count": 1.0}
    sent = [
        SysMetrics(t=5.0 * k, unit=u, node="n", procs=3, cpu_pct=97.0 + u, rss_mb=2048.5,
                   host_mem_used_mb=9000.0, host_mem_total_mb=64000.0,
                   gpu=gpu if u else {}).to_json()
        for k in range(1, 4) for u in range(2)
    ]  # fmt: skip
    assert _send(client, run_id, 1, [*sent, _step(1)]).json()["stored"] == 7
    body = client.get(f"/api/runs/{run_id}/events/", {"kind": "sys_metrics"}).json()
    served = [(e["t"], e["data"]["unit"], e["data"]["cpu_pct"], e["data"]["gpu"]) for e in
              body["events"]]  # fmt: skip
    assert served == [(5.0 * k, u, 97.0 + u, gpu if u else {}) for k in (1, 2, 3) for u in (0, 1)]
    bad = {**sent[0], "data": {**sent[0]["data"], "gpu": {"util_pct": "busy"}}}
    r = _send(client, run_id, 8, [bad])
    assert r.status_code == 400 and "data.gpu" in r.json()["detail"]
    assert MetricPoint.objects.filter(run_id=run_id).count() == 1  # only the step's loss
