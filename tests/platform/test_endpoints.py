"""Every GET endpoint of the OpenAPI schema, as each kind of caller: no server errors, and
the permission matrix (members read, outsiders get 404, anonymous 401/403, a share link
reads its run and nothing else: 403, or 404 where the endpoint does not exist for it); every write as a viewer is refused."""

from __future__ import annotations

import io
import re

import pytest
from gyre_web.alerts.services import create_webhook
from gyre_web.cluster.services import register_gpu
from gyre_web.datasets.services import create_dataset
from gyre_web.runs import services
from gyre_web.sweeps.services import create_sweep
from gyre_web.teams import services as teams
from gyre_web.trajectories.services import create_tree

from tests.platform.uploads import fake_checkpoint, fake_export

pytestmark = pytest.mark.django_db
TEAM_SCOPED = (
    "teams", "experiments", "runs", "rollouts", "trees", "share-links", "webhooks", "sweeps",
    "datasets",
)  # fmt: skip
NOT_FOR_SHARE_LINKS = ("datasets",)  # a share link finds nothing there: 404, not 403


@pytest.fixture
def world(people, sim_config, settings):
    settings.GYRE_WEBHOOK_ALLOW_NETS = ["127.0.0.0/8"]  # its webhooks: a closed loopback port
    exp = services.create_experiment(team=people["team"], name="x")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    services.append_events(
        run_id=run.pk,
        events=[
            {"kind": "rollout_started", "t": 0.0,
             "data": {"rollout_id": "r0", "task_id": "t", "group_id": "g", "step": 1}},
            {"kind": "step_finished", "t": 1.0,
             "data": {"step": 1, "version": 1, "metrics": {"loss": 0.1}}},
        ],
    )  # fmt: skip
    from gyre_web.trajectories.services import record_rollout_events

    record_rollout_events(
        run_id=run.pk,
        events=[{"kind": "rollout_started", "t": 0.0, "data": {"rollout_id": "r0", "step": 1}}],
    )
    tree = create_tree(run_id=run.pk, group_id="g", nodes=[{"id": 0, "parent": None,
                                                            "preview": "root"}])  # fmt: skip
    gpu = register_gpu(node_name="n", index=0)
    fake_checkpoint(run.pk, 1)
    fake_export(run.pk, 1)
    token, _ = teams.create_api_token(user=people["member"], name="t")
    link, share_key = teams.create_share_link(created_by=people["owner"], run=run)
    hook = create_webhook(team=people["team"], url="http://127.0.0.1:9/hook", events=["failed"])
    sweep = create_sweep(
        experiment=exp, base_config=sim_config, mode="grid", params={"seed": [1]}, max_concurrent=1
    )
    ids = {
        "teams": people["team"].pk, "experiments": exp.pk, "runs": run.pk,
        "rollouts": run.rollouts.get().pk, "trees": tree.pk, "gpus": gpu.pk,
        "tokens": token.pk, "share-links": link.pk, "webhooks": hook.pk, "sweeps": sweep.pk,
        "datasets": create_dataset(
            team=people["team"], name="d", kind="tasks", upload=io.BytesIO(b'{"id": "t"}\n')
        ).pk,
    }  # fmt: skip
    return {"ids": ids, "node": tree.tree_nodes.get().pk, "run": run, "share": share_key}


# Answers anyone: signed out is an answer there, not an error (test_session.py).
OPEN = frozenset({"/api/auth/session/"})


def _get_paths(client) -> list[str]:
    schema = client.get("/api/schema/?format=json").json()
    return [p for p, ops in schema["paths"].items() if "get" in ops]


def _fill(path: str, world) -> str:
    collection = path.split("/")[2]
    if "{id}" in path:
        path = path.replace("{id}", str(world["ids"][collection]))
    path = path.replace("{node_id}", str(world["node"])).replace("{version}", "1")
    return path + "?q=root&runs=" + str(world["run"].pk)


def test_every_get_endpoint_as_every_caller(world, people, client_for):
    paths = _get_paths(client_for(people["member"]))
    assert len(paths) >= 20
    for template in paths:
        url = _fill(template, world)
        collection = template.split("/")[2]
        detail = "{id}" in template
        for role in ("owner", "member", "viewer"):
            status = client_for(people[role]).get(url).status_code
            assert status == 200 or (collection == "tokens" and role != "member"), (url, role)
        outsider = client_for(people["outsider"]).get(url).status_code
        if detail and collection in TEAM_SCOPED:
            assert outsider == 404, url
        assert outsider < 500, url
        anonymous = client_for().get(url).status_code
        assert anonymous == 200 if template in OPEN else anonymous in (401, 403), url
        shared = client_for().get(url, HTTP_X_GYRE_SHARE=world["share"]).status_code
        readable = collection in ("runs", "rollouts", "trees", "experiments", "sweeps")
        assert shared < 500, url
        if collection in NOT_FOR_SHARE_LINKS:
            assert shared == 404, url
        elif not readable and template not in OPEN:
            assert shared == 403, url


def test_share_link_reads_everything_under_its_run(world, client_for):
    anon = client_for()
    key = {"HTTP_X_GYRE_SHARE": world["share"]}
    run_id = world["run"].pk
    for url in (f"/api/runs/{run_id}/", f"/api/runs/{run_id}/metrics/",
                f"/api/runs/{run_id}/events/", f"/api/trees/{world['ids']['trees']}/nodes/",
                f"/api/rollouts/{world['ids']['rollouts']}/"):  # fmt: skip
        assert anon.get(url, **key).status_code == 200, url


def test_every_write_as_a_viewer_is_refused(world, people, client_for, sim_config):
    viewer = client_for(people["viewer"])
    ids = world["ids"]
    writes = [
        ("post", "/api/experiments/", {"team": ids["teams"], "name": "n"}),
        ("patch", f"/api/experiments/{ids['experiments']}/", {"name": "n"}),
        ("delete", f"/api/experiments/{ids['experiments']}/", None),
        ("post", "/api/runs/", {"experiment": ids["experiments"], "config": sim_config}),
        ("delete", f"/api/runs/{ids['runs']}/", None),
        ("post", f"/api/runs/{ids['runs']}/cancel/", None),
        ("post", f"/api/runs/{ids['runs']}/pause/", None),
        ("post", f"/api/runs/{ids['runs']}/resume/", None),
        ("post", f"/api/runs/{ids['runs']}/fork/", {}),
        ("post", f"/api/runs/{ids['runs']}/checkpoints/1/export/", None),
        ("patch", f"/api/teams/{ids['teams']}/", {"name": "n"}),
        ("delete", f"/api/teams/{ids['teams']}/", None),
        ("post", f"/api/teams/{ids['teams']}/members/", {"username": "viewer", "role": "owner"}),
        ("post", "/api/share-links/", {"run": ids["runs"]}),
        ("delete", f"/api/share-links/{ids['share-links']}/", None),
        ("post", "/api/gpus/", {"node": 1, "index": 3}),
        (
            "post",
            "/api/sweeps/",
            {
                "experiment": ids["experiments"],
                "base_config": sim_config,
                "mode": "grid",
                "params": {"seed": [1]},
                "max_concurrent": 1,
            },
        ),
        ("post", f"/api/sweeps/{ids['sweeps']}/cancel/", None),
        ("delete", f"/api/datasets/{ids['datasets']}/", None),  # upload: test_datasets.py
    ]
    for method, url, body in writes:
        status = getattr(viewer, method)(url, body, format="json").status_code
        assert status == 403, (method, url, status)
    assert re.match(r"^gyre_share_", world["share"])
