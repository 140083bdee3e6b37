"""GET /api/runs/{id}/roles/: the stored role intervals of a run with a window, a cap that
says when it cut, GPU-seconds and shares per role; who may read it; and ``can_edit`` on a
run, which tells the dashboard whether to show the write controls."""

from __future__ import annotations

import pytest
from gyre_web.cluster import services as cluster
from gyre_web.runs import services
from gyre_web.teams import services as teams

pytestmark = pytest.mark.django_db


def _change(t: float, unit: int, to_role: str) -> dict:
    return {"kind": "role_change", "t": t, "data": {"unit": unit, "to_role": to_role}}


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="roles")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    # Unit 0: rollout 0-10, train 10-15, rollout 15-(open). Unit 1 (two leased GPUs):
    # train 0-4, rollout 4-20. The run's clock is at 20 (its last event).
    cluster.record_role_changes(
        run_id=run.pk,
        events=[_change(0.0, 0, "rollout"), _change(0.0, 1, "train"), _change(4.0, 1, "rollout"),
                _change(10.0, 0, "train"), _change(15.0, 0, "rollout"),
                _change(20.0, 1, "idle")],
    )  # fmt: skip
    gpus = [cluster.register_gpu(node_name="n", index=i) for i in range(2)]
    cluster.lease_gpus(run_id=run.pk, unit_index=1, gpus=gpus)
    services.append_events(
        run_id=run.pk,
        events=[{"kind": "run_status", "t": 20.0, "data": {"status": "running", "step": 1}}],
    )
    return run


def test_intervals_shares_and_gpus_per_unit(run, people, client_for):
    body = client_for(people["viewer"]).get(f"/api/runs/{run.pk}/roles/").json()
    assert body["horizon"] == 20.0 and (body["t0"], body["t1"]) == (0.0, 20.0)
    assert body["units"] == [{"unit": 0, "gpus": 1}, {"unit": 1, "gpus": 2}]
    assert body["truncated"] is False
    got = [(i["unit"], i["role"], i["start"], i["end"]) for i in body["intervals"]]
    assert got == [
        (0, "rollout", 0.0, 10.0), (1, "train", 0.0, 4.0), (1, "rollout", 4.0, 20.0),
        (0, "train", 10.0, 15.0), (0, "rollout", 15.0, None), (1, "idle", 20.0, None),
    ]  # fmt: skip
    # GPU-seconds: unit 0 (1 GPU) rollout 10 + 5 (open to 20), train 5; unit 1 (2 GPUs)
    # train 4 s, rollout 16 s, idle 0.
    assert body["gpu_seconds"] == {"rollout": 15.0 + 32.0, "train": 5.0 + 8.0,
                                   "switching": 0.0, "idle": 0.0}  # fmt: skip
    assert body["shares"]["rollout"] == pytest.approx(47 / 60)
    assert sum(body["shares"].values()) == pytest.approx(1.0)


def test_a_window_clips_the_intervals_and_the_seconds(run, people, client_for):
    body = client_for(people["member"]).get(f"/api/runs/{run.pk}/roles/?t0=5&t1=12").json()
    got = [(i["unit"], i["role"]) for i in body["intervals"]]
    assert got == [(0, "rollout"), (1, "rollout"), (0, "train")]
    # 5-12: unit 0 rollout 5 s + train 2 s; unit 1 rollout 7 s × 2 GPUs.
    assert body["gpu_seconds"]["rollout"] == 5.0 + 14.0
    assert body["gpu_seconds"]["train"] == 2.0


def test_the_cap_says_it_truncated_but_the_shares_count_everything(run, people, client_for):
    body = client_for(people["member"]).get(f"/api/runs/{run.pk}/roles/?limit=2").json()
    assert len(body["intervals"]) == 2 and body["truncated"] is True
    assert body["gpu_seconds"]["rollout"] == 47.0
    full = client_for(people["member"]).get(f"/api/runs/{run.pk}/roles/?limit=6").json()
    assert full["truncated"] is False and len(full["intervals"]) == 6


@pytest.mark.parametrize("query", ["t0=x", "t0=-1", "t0=5&t1=2", "limit=0", "t1=inf"])
def test_bad_parameters_are_answered_400(run, people, client_for, query):
    resp = client_for(people["member"]).get(f"/api/runs/{run.pk}/roles/?{query}")
    assert resp.status_code == 400, query


def test_who_may_read_the_role_timeline(run, people, client_for):
    url = f"/api/runs/{run.pk}/roles/"
    for role in ("owner", "admin", "member", "viewer"):
        assert client_for(people[role]).get(url).status_code == 200, role
    assert client_for(people["outsider"]).get(url).status_code == 404
    assert client_for().get(url).status_code in (401, 403)
    _, key = teams.create_share_link(created_by=people["owner"], run=run)
    shared = client_for().get(url, HTTP_X_GYRE_SHARE=key)
    assert shared.status_code == 200 and len(shared.json()["intervals"]) == 6


def test_an_empty_run_has_no_intervals_and_zero_shares(people, sim_config, client_for):
    exp = services.create_experiment(team=people["team"], name="empty")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    body = client_for(people["member"]).get(f"/api/runs/{run.pk}/roles/").json()
    assert body["intervals"] == [] and body["units"] == [] and body["horizon"] == 0.0
    assert set(body["shares"].values()) == {0.0}


def test_can_edit_follows_the_callers_role(run, people, client_for):
    detail = f"/api/runs/{run.pk}/"
    for role, expected in (("owner", True), ("admin", True), ("member", True), ("viewer", False)):
        assert client_for(people[role]).get(detail).json()["can_edit"] is expected, role
        listed = client_for(people[role]).get("/api/runs/").json()["results"]
        assert [r["can_edit"] for r in listed] == [expected], role
    _, key = teams.create_share_link(created_by=people["owner"], run=run)
    assert client_for().get(detail, HTTP_X_GYRE_SHARE=key).json()["can_edit"] is False
    # The answer to a write carries it too (the dashboard replaces its copy of the run).
    cancelled = client_for(people["member"]).post(f"/api/runs/{run.pk}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["can_edit"] is True


def test_a_public_experiment_is_readable_but_not_editable_by_an_outsider(run, people, client_for):
    run.experiment.visibility = "public"
    run.experiment.save()
    resp = client_for(people["outsider"]).get(f"/api/runs/{run.pk}/")
    assert resp.status_code == 200 and resp.json()["can_edit"] is False
    assert client_for(people["outsider"]).get(f"/api/runs/{run.pk}/roles/").status_code == 200
