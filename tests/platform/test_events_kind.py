"""The event log filtered by kind (``?kind=``): what the compare page reads to put a run's
steps on its clock (the ``t`` of each ``step_finished``)."""

from __future__ import annotations

import pytest
from gyre_web.runs import selectors, services

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="clock")
    return services.create_run(experiment=exp, config=sim_config, name="r", launch=False)


def _log(run_id: int) -> None:
    events = []
    for step in range(4):
        events.append({"kind": "run_status", "t": 10.0 * step, "data": {"status": "running"}})
        events.append({"kind": "step_finished", "t": 10.0 * step + 7.5,
                       "data": {"step": step, "metrics": {"loss": 1.0 / (step + 1)}}})  # fmt: skip
    services.append_events(run_id=run_id, events=events)


def test_kind_filter_keeps_the_cursor_and_the_limit(people, run, client_for):
    _log(run.pk)
    client = client_for(people["viewer"])
    url = f"/api/runs/{run.pk}/events/"
    body = client.get(url, {"kind": "step_finished"}).json()
    assert [e["kind"] for e in body["events"]] == ["step_finished"] * 4
    assert [(e["data"]["step"], e["t"]) for e in body["events"]] == [
        (0, 7.5), (1, 17.5), (2, 27.5), (3, 37.5)
    ]  # fmt: skip
    seqs = [e["seq"] for e in body["events"]]
    # The cursor is still the seq over all kinds: paging resumes after the last one seen.
    page = client.get(url, {"kind": "step_finished", "after": seqs[1], "limit": 1}).json()
    assert [e["seq"] for e in page["events"]] == [seqs[2]]
    both = client.get(url, {"kind": "step_finished,run_status"}).json()["events"]
    assert len(both) == 8
    assert len(client.get(url).json()["events"]) == 8  # no filter: every kind
    assert client.get(url, {"kind": "nothing_like_this"}).json()["events"] == []


def test_a_malformed_kind_is_refused(people, run, client_for):
    client = client_for(people["viewer"])
    resp = client.get(f"/api/runs/{run.pk}/events/", {"kind": "step_finished;drop"})
    assert resp.status_code == 400 and "kind" in resp.json()


def test_selector_filters_by_kinds(run):
    _log(run.pk)
    rows = selectors.events_after(run_id=run.pk, kinds=["step_finished"], limit=2)
    assert [r.data["step"] for r in rows] == [0, 1]
    assert len(selectors.events_after(run_id=run.pk, kinds=[])) == 8


def test_phase_progress_is_stored_served_and_followed_on_the_terminal(people, run, client_for):
    from gyre_web.runs.management.commands.gyre_demo import _describe

    from gyre_core.events import PhaseProgress

    _log(run.pk)
    phases = [PhaseProgress(t=1.0 + k, phase="warm start", done=25 * k, total=100,
                            message=f"loss {1.0 / (k + 1):.3f} (target 0.12)")
              for k in range(3)]  # fmt: skip
    services.append_events(run_id=run.pk, events=[p.to_json() for p in phases])
    client = client_for(people["viewer"])
    body = client.get(f"/api/runs/{run.pk}/events/", {"kind": "phase_progress"}).json()
    served = [e["data"] for e in body["events"]]
    assert [(d["phase"], d["done"], d["total"]) for d in served] == [
        ("warm start", 0, 100), ("warm start", 25, 100), ("warm start", 50, 100)
    ]  # fmt: skip
    assert _describe("phase_progress", served[1]) == "warm start 25/100, loss 0.500 (target 0.12)"
    assert len(selectors.events_after(run_id=run.pk, kinds=[])) == 11  # beside the others
