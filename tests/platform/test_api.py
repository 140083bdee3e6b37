"""The REST API: CRUD, config validation by field, actions, auth and the permission matrix."""

from __future__ import annotations

import pytest
from gyre_web.runs import services
from gyre_web.runs.models import Run, Status
from gyre_web.teams.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def exp(people):
    return services.create_experiment(team=people["team"], name="sweep", tags=["elastic"])


@pytest.fixture
def run(exp, sim_config):
    return services.create_run(experiment=exp, config=sim_config, name="r1", launch=False)


def test_create_run_validates_and_launches_on_commit(
    people, exp, sim_config, client_for, django_capture_on_commit_callbacks
):
    client = client_for(people["member"])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        resp = client.post(
            "/api/runs/", {"experiment": exp.pk, "config": sim_config, "name": "a"}, format="json"
        )
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["status"] == "queued" and body["backend"] == "sim" and body["celery_task_id"]
    assert len(callbacks) == 1  # the launch waits for the commit


def test_bad_config_returns_every_bad_field_by_name(people, exp, sim_config, client_for):
    sim_config["scheduler"]["policy"] = "greedy"
    sim_config["rollout"] = {"group_size": 0, "bogus": 1}
    resp = client_for(people["member"]).post(
        "/api/runs/", {"experiment": exp.pk, "config": sim_config}, format="json"
    )
    assert resp.status_code == 400
    errors = resp.json()["config"]
    assert {"scheduler.policy", "rollout.group_size", "rollout.bogus"} <= set(errors)
    assert not Run.objects.exists()


def test_an_external_agent_is_refused_unless_the_operator_allows_it(
    people, exp, sim_config, client_for, settings
):
    """A run's external agent is code the workers run: off unless GYRE_EXTERNAL_AGENTS."""
    sim_config["rollout"] = {"agent_command": "python agent.py"}
    post = lambda: client_for(people["member"]).post(  # noqa: E731
        "/api/runs/", {"experiment": exp.pk, "config": sim_config}, format="json"
    )
    settings.GYRE_EXTERNAL_AGENTS = False
    resp = post()
    assert resp.status_code == 400 and list(resp.json()["config"]) == ["rollout.agent_command"]
    assert "GYRE_EXTERNAL_AGENTS" in str(resp.json()["config"]) and not Run.objects.exists()
    settings.GYRE_EXTERNAL_AGENTS = True
    assert post().status_code == 201


def test_a_cross_field_rule_is_refused_by_name_before_a_run_is_queued(people, exp, client_for):
    """kv_heads must divide the tiny model's heads: the API says so, instead of the worker
    failing minutes later while it builds the model."""
    config = {"model": {"hidden_size": 128, "kv_heads": 3}}
    resp = client_for(people["member"]).post(
        "/api/runs/", {"experiment": exp.pk, "config": config}, format="json"
    )
    assert resp.status_code == 400, resp.content
    errors = resp.json()["config"]
    assert list(errors) == ["model.kv_heads"]
    assert "hidden_size // 32 = 4" in str(errors["model.kv_heads"])
    assert not Run.objects.exists()


def test_fork_and_resume_and_cancel(people, run, client_for):
    client = client_for(people["member"])
    resp = client.post(f"/api/runs/{run.pk}/fork/", {"changes": {"seed": 3}}, format="json")
    assert resp.status_code == 201
    assert resp.json()["parent"] == run.pk and resp.json()["seed"] == 3
    bad = client.post(f"/api/runs/{run.pk}/fork/", {"changes": {"steps": -1}}, format="json")
    assert bad.status_code == 400 and "steps" in bad.json()["config"]

    assert (
        client.post(f"/api/runs/{run.pk}/resume/").status_code == 409
    )  # queued: nothing to resume
    assert client.post(f"/api/runs/{run.pk}/cancel/").json()["status"] == "cancelled"
    assert client.post(f"/api/runs/{run.pk}/cancel/").status_code == 409
    assert client.post(f"/api/runs/{run.pk}/resume/").json()["status"] == "queued"


def test_permission_matrix_for_runs(people, run, client_for):
    url = f"/api/runs/{run.pk}/"
    for role in ("owner", "admin", "member", "viewer"):
        assert client_for(people[role]).get(url).status_code == 200, role
    assert client_for(people["outsider"]).get(url).status_code == 404
    assert client_for().get(url).status_code in (401, 403)
    # the viewer reads but cannot act; the outsider does not even see it
    assert client_for(people["viewer"]).post(f"{url}cancel/").status_code == 403
    assert client_for(people["outsider"]).post(f"{url}cancel/").status_code == 404
    assert client_for(people["viewer"]).post(f"{url}fork/", {}, format="json").status_code == 403
    listing = client_for(people["outsider"]).get("/api/runs/").json()
    assert listing["results"] == []


def test_viewer_cannot_create_and_outsider_cannot_use_a_foreign_experiment(
    people, exp, sim_config, client_for
):
    body = {"experiment": exp.pk, "config": sim_config}
    assert client_for(people["viewer"]).post("/api/runs/", body, format="json").status_code == 403
    resp = client_for(people["outsider"]).post("/api/runs/", body, format="json")
    assert resp.status_code == 400 and "experiment" in resp.json()
    resp = client_for(people["viewer"]).post(
        "/api/experiments/", {"team": people["team"].pk, "name": "x"}, format="json"
    )
    assert resp.status_code == 403


def test_experiment_crud_and_filters(people, exp, client_for):
    client = client_for(people["member"])
    resp = client.post(
        "/api/experiments/",
        {"team": people["team"].pk, "name": "ablation", "tags": ["async", "long"]},
        format="json",
    )
    assert resp.status_code == 201
    names = [e["name"] for e in client.get("/api/experiments/?tag=async").json()["results"]]
    assert names == ["ablation"]
    assert client.patch(f"/api/experiments/{exp.pk}/", {"description": "d"}).status_code == 200
    assert client_for(people["outsider"]).get(f"/api/experiments/{exp.pk}/").status_code == 404


def test_run_filters(people, run, exp, sim_config, client_for):
    services.transition(run.pk, Status.CANCELLED)
    services.create_run(experiment=exp, config=sim_config, launch=False)
    client = client_for(people["viewer"])
    assert len(client.get("/api/runs/?status=cancelled").json()["results"]) == 1
    assert len(client.get(f"/api/runs/?experiment={exp.pk}").json()["results"]) == 2
    assert client.get("/api/runs/?status=nonsense").status_code == 400


def test_share_link_reads_its_run_only_and_is_revocable(people, run, exp, sim_config, client_for):
    other = services.create_run(experiment=exp, config=sim_config, launch=False)
    owner = client_for(people["member"])
    resp = owner.post("/api/share-links/", {"run": run.pk}, format="json")
    assert resp.status_code == 201
    key, link_id = resp.json()["key"], resp.json()["id"]
    anon = client_for()
    assert anon.get(f"/api/runs/{run.pk}/", HTTP_X_GYRE_SHARE=key).status_code == 200
    assert anon.get(f"/api/runs/{run.pk}/events/?share={key}").status_code == 200
    assert anon.get(f"/api/runs/{other.pk}/", HTTP_X_GYRE_SHARE=key).status_code == 404
    assert anon.post(f"/api/runs/{run.pk}/cancel/", HTTP_X_GYRE_SHARE=key).status_code == 403
    assert anon.get("/api/teams/", HTTP_X_GYRE_SHARE=key).status_code == 403
    assert client_for(people["viewer"]).delete(f"/api/share-links/{link_id}/").status_code == 403
    assert owner.delete(f"/api/share-links/{link_id}/").status_code == 204
    assert anon.get(f"/api/runs/{run.pk}/", HTTP_X_GYRE_SHARE=key).status_code == 401


def test_experiment_share_link_covers_its_runs(people, run, exp, client_for):
    key = (
        client_for(people["owner"])
        .post("/api/share-links/", {"experiment": exp.pk}, format="json")
        .json()["key"]
    )
    anon = client_for()
    runs = anon.get(f"/api/runs/?share={key}").json()["results"]
    assert [r["id"] for r in runs] == [run.pk]
    assert anon.get(f"/api/experiments/{exp.pk}/?share={key}").status_code == 200


def test_api_token_is_shown_once_and_records_last_use(people, client_for):
    from rest_framework.test import APIClient

    me = client_for(people["member"])
    created = me.post("/api/tokens/", {"name": "laptop"}, format="json").json()
    key = created["key"]
    assert "key" not in me.get(f"/api/tokens/{created['id']}/").json()
    script = APIClient()
    assert script.get("/api/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    assert script.get("/api/teams/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert ApiToken.objects.get(pk=created["id"]).last_used_at is not None
    assert me.delete(f"/api/tokens/{created['id']}/").status_code == 204
    assert script.get("/api/teams/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    assert script.get("/api/teams/", HTTP_AUTHORIZATION="Token nope").status_code == 401


def test_teams_and_memberships(people, client_for):
    admin = client_for(people["admin"])
    team = people["team"]
    listed = admin.get("/api/teams/").json()["results"]
    assert [(t["slug"], t["role"]) for t in listed] == [("lab", "admin")]
    resp = admin.post(
        f"/api/teams/{team.pk}/members/", {"username": "outsider", "role": "viewer"}, format="json"
    )
    assert resp.status_code == 201
    assert client_for(people["outsider"]).get(f"/api/teams/{team.pk}/").status_code == 200
    member = client_for(people["member"])
    resp = member.post(
        f"/api/teams/{team.pk}/members/", {"username": "viewer", "role": "owner"}, format="json"
    )
    assert resp.status_code == 403
    created = member.post("/api/teams/", {"name": "New Team"}, format="json").json()
    assert created["slug"] == "new-team" and created["role"] == "owner"


def test_metrics_downsampled_and_aligned_across_runs(people, run, exp, sim_config, client_for):
    from gyre_web.runs.models import MetricPoint

    other = services.create_run(experiment=exp, config=sim_config, launch=False)
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, name="loss", step=s, value=float(s)) for s in range(100)]
        + [MetricPoint(run=other, name="loss", step=s, value=-float(s)) for s in range(0, 100, 2)]
    )
    client = client_for(people["viewer"])
    body = client.get(f"/api/runs/metrics/?runs={run.pk},{other.pk}&names=loss&points=10").json()
    assert body["bucket"] == 10
    first, second = body["series"]
    assert [p["step"] for p in first["points"]] == list(range(0, 100, 10))
    assert [p["step"] for p in second["points"]] == list(range(0, 100, 10))  # aligned
    bucket = first["points"][3]  # steps 30..39
    assert (bucket["min"], bucket["max"], bucket["last"], bucket["last_step"]) == (30, 39, 39, 39)
    assert second["points"][3]["last"] == -38.0
    one = client.get(f"/api/runs/{run.pk}/metrics/?points=3").json()
    assert one["bucket"] == 34 and len(one["series"][0]["points"]) == 3
    assert client.get(f"/api/runs/metrics/?runs={run.pk}&points=0").status_code == 400
    outsider = client_for(people["outsider"])
    assert outsider.get(f"/api/runs/metrics/?runs={run.pk}").status_code == 404


def test_events_after_a_cursor(people, run, client_for):
    services.append_events(
        run_id=run.pk,
        events=[{"kind": "run_status", "t": float(i), "data": {"status": "running", "step": i}}
                for i in range(5)],
    )  # fmt: skip
    body = client_for(people["viewer"]).get(f"/api/runs/{run.pk}/events/?after=2").json()
    assert [e["seq"] for e in body["events"]] == [3, 4, 5]
    assert (
        client_for(people["viewer"]).get(f"/api/runs/{run.pk}/events/?after=x").status_code == 400
    )


def test_tree_nodes_lazy_search_and_path(people, run, client_for):
    from gyre_web.trajectories.services import create_tree

    tree = create_tree(
        run_id=run.pk,
        group_id="g",
        nodes=[{"id": 0, "parent": None, "preview": "root"}]
        + [{"id": i, "parent": 0, "preview": f"child {i}"} for i in range(1, 4)],
    )
    client = client_for(people["viewer"])
    roots = client.get(f"/api/trees/{tree.pk}/nodes/").json()["results"]
    assert [n["preview"] for n in roots] == ["root"]
    kids = client.get(f"/api/trees/{tree.pk}/nodes/?parent={roots[0]['id']}").json()["results"]
    assert [n["preview"] for n in kids] == ["child 1", "child 2", "child 3"]
    found = client.get(f"/api/trees/{tree.pk}/search/?q=child 2").json()
    path = client.get(f"/api/trees/{tree.pk}/path/{found[0]['id']}/").json()
    assert [n["preview"] for n in path] == ["root", "child 2"]
    assert client_for(people["outsider"]).get(f"/api/trees/{tree.pk}/").status_code == 404


def test_gpus_are_registered_by_staff_only(people, client_for):
    from gyre_web.cluster.services import register_gpu

    register_gpu(node_name="n0", index=0, model="H100")
    member = client_for(people["member"])
    assert [g["node_name"] for g in member.get("/api/gpus/").json()["results"]] == ["n0"]
    node = member.get("/api/gpus/").json()["results"][0]["node"]
    assert member.post("/api/gpus/", {"node": node, "index": 1}).status_code == 403
    people["admin"].is_staff = True
    assert (
        client_for(people["admin"]).post("/api/gpus/", {"node": node, "index": 1}).status_code
        == 201
    )


def test_openapi_schema_and_docs(people, client_for):
    client = client_for(people["member"])
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    for p in ("/api/runs/", "/api/runs/{id}/fork/", "/api/trees/{id}/nodes/", "/api/tokens/"):
        assert p in paths
    assert client.get("/api/docs/").status_code == 200
