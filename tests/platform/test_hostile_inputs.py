"""Hostile input, one row each: every answer is a 4xx JSON body naming the offending field
(never HTML, never a 500). REST rows name a key path of the body; import rows the
``line`` and ``field`` of the reader; a failed import leaves no file behind."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from gyre_web.runs import services
from gyre_web.teams import services as teams

from gyre_core.trajectory.synth import SynthConfig, synth_rollouts
from gyre_core.trajectory.writer import write_rollouts

pytestmark = pytest.mark.django_db

DEEP_1000 = "[" * 1000 + "]" * 1000
BIG_INT = "1" + "0" * 5000


@pytest.fixture
def world(people, sim_config, client_for) -> dict[str, Any]:
    exp = services.create_experiment(team=people["team"], name="hostile")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    member = client_for(people["member"])
    resp = _upload(member, run.pk, _good_jsonl())
    assert resp.status_code == 201, resp.content
    tree = run.trees.first()
    _, share = teams.create_share_link(created_by=people["owner"], run=run)
    return {"exp": exp, "run": run, "tree": tree, "member": member, "share": share,
            "sim_config": sim_config, "anon": client_for()}  # fmt: skip


def _good_jsonl(groups: int = 1) -> bytes:
    buf = io.StringIO()
    cfg = SynthConfig(groups=groups, group_size=2, turns=2, system_tokens=16,
                      completion_tokens=8, tool_tokens=8, seed=3)  # fmt: skip
    write_rollouts(buf, synth_rollouts(cfg))
    return buf.getvalue().encode()


def _upload(client: Any, run_id: int, data: bytes) -> Any:
    file = SimpleUploadedFile("t.jsonl", data, content_type="application/jsonl")
    return client.post(f"/api/runs/{run_id}/import/", {"file": file}, format="multipart")


def _config(w: dict[str, Any], **changes: Any) -> str:
    """A run-create body as JSON text; a value "@RAW@" is replaced by raw JSON later."""
    return json.dumps({"experiment": w["exp"].pk, "config": {**w["sim_config"], **changes}})


def _raw(body: str, raw: str) -> str:
    return body.replace('"@RAW@"', raw)


# (id, method, path, body (JSON text, or None), who, key path the body must name)
REST = [
    ("tags NUL", "post", "/api/experiments/", lambda w: json.dumps(
        {"team": w["exp"].team_id, "name": "x", "tags": ["a\x00"]}), "member", ("tags",)),
    ("experiment name NUL", "post", "/api/experiments/", lambda w: json.dumps(
        {"team": w["exp"].team_id, "name": "a\x00"}), "member", ("name",)),
    ("run name NUL", "post", "/api/runs/", lambda w: json.dumps(
        {"experiment": w["exp"].pk, "name": "a\x00", "config": w["sim_config"]}), "member",
     ("name",)),
    ("run name 1 MB", "post", "/api/runs/", lambda w: json.dumps(
        {"experiment": w["exp"].pk, "name": "n" * 2**20, "config": w["sim_config"]}), "member",
     ("name",)),
    ("config string NUL", "post", "/api/runs/", lambda w: _config(w, name="a\x00"), "member",
     ("config", "name")),
    ("config.name 1 MB", "post", "/api/runs/", lambda w: _config(w, name="n" * 2**20),
     "member", ("config", "name")),
    ("steps 2^31", "post", "/api/runs/", lambda w: _config(w, steps=2**31), "member",
     ("config", "steps")),
    ("seed 2^63", "post", "/api/runs/", lambda w: _config(w, seed=2**63), "member",
     ("config", "seed")),
    ("cluster.units 10^6", "post", "/api/runs/", lambda w: _config(w, cluster={"units": 10**6}),
     "member", ("config", "cluster.units")),
    ("sim.speed 1e400", "post", "/api/runs/", lambda w: _raw(_config(
        w, sim={**w["sim_config"]["sim"], "speed": "@RAW@"}), "1e400"), "member",
     ("config.sim.speed",)),
    ("cluster.units 1e400", "post", "/api/runs/", lambda w: _raw(_config(
        w, cluster={"units": "@RAW@"}), "1e400"), "member", ("config.cluster.units",)),
    ("5,000-digit steps", "post", "/api/runs/", lambda w: _raw(_config(w, steps="@RAW@"),
        BIG_INT), "member", ("body",)),
    ("nested 1,000 deep", "post", "/api/runs/", lambda w: _raw(_config(w, name="@RAW@"),
        DEEP_1000), "member", ("body",)),
    ("fork nested 1,000 deep", "post", "/api/runs/{run}/fork/", lambda w: _raw(json.dumps(
        {"changes": {"name": "@RAW@"}}), DEEP_1000), "member", ("body",)),
    ("fork steps 2^31", "post", "/api/runs/{run}/fork/", lambda w: json.dumps(
        {"changes": {"steps": 2**31}}), "member", ("config", "steps")),
    ("5 MB JSON body", "post", "/api/runs/", lambda w: _config(w, name="n" * 5 * 2**20),
     "member", ("body",)),
    ("team slug taken", "post", "/api/teams/", lambda w: json.dumps(
        {"name": "Other", "slug": w["exp"].team.slug}), "member", ("slug",)),
    ("metrics names NUL", "get", "/api/runs/{run}/metrics/?names=%00", None, "member",
     ("names",)),
    ("metrics names NUL, share link", "get", "/api/runs/{run}/metrics/?names=%00", None,
     "share", ("names",)),
    ("compare names NUL", "get", "/api/runs/metrics/?runs={run}&names=a%00", None, "member",
     ("names",)),
    ("search q NUL, share link", "get", "/api/trees/{tree}/search/?q=%00", None, "share",
     ("q",)),
    ("nodes parent superscript", "get", "/api/trees/{tree}/nodes/?parent=%C2%B2", None,
     "share", ("parent",)),
    ("unknown API path", "get", "/api/no-such-thing/", None, "member", ("detail",)),
]  # fmt: skip


def _names(body: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(body, dict) or key not in body:
            return False
        body = body[key]
    return True


@pytest.mark.parametrize(("method", "path", "body", "who", "field"),
                         [r[1:] for r in REST], ids=[r[0] for r in REST])  # fmt: skip
def test_rest_refuses_with_json_naming_the_field(world, method, path, body, who, field):
    url = path.format(run=world["run"].pk, tree=world["tree"].pk)
    client = world["anon"] if who == "share" else world["member"]
    extra = {"HTTP_X_GYRE_SHARE": world["share"]} if who == "share" else {}
    if body is None:
        resp = getattr(client, method)(url, **extra)
    else:
        resp = getattr(client, method)(
            url, data=body(world), content_type="application/json", **extra
        )
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:300])
    assert resp["Content-Type"].startswith("application/json"), resp.content[:300]
    data = resp.json()
    assert _names(data, field), data if len(str(data)) < 500 else str(data)[:500]
    assert "Traceback" not in resp.content.decode(errors="replace")


def test_an_oversized_form_body_is_json_not_html(world):
    """Django itself refuses it (RequestDataTooBig, over DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    body = "name=" + "n" * 5 * 2**20
    resp = world["member"].post("/api/experiments/", data=body,
                                content_type="application/x-www-form-urlencoded")  # fmt: skip
    assert resp.status_code == 400 and resp.json() == {
        "body": f"larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"
    }


@pytest.mark.parametrize("names", [["Team A", "Team A", "Team A"], ["!!!", "???"], ["0", "0"]])
def test_team_slugs_are_unique_and_never_empty(people, client_for, names):
    owner = client_for(people["owner"])
    slugs = []
    for name in names:
        resp = owner.post("/api/teams/", {"name": name}, format="json")
        assert resp.status_code == 201, resp.content
        slugs.append(resp.json()["slug"])
    assert all(slugs) and len(set(slugs)) == len(slugs), slugs


def test_share_links_see_no_server_paths(world, people):
    run, tree = world["run"], world["tree"]
    type(run).objects.filter(pk=run.pk).update(
        checkpoint_path="/srv/gyre/runs/1/ckpt",
        error='Traceback (most recent call last):\n  File "/srv/gyre/x.py", line 3\n'
        "OSError: cannot read /srv/gyre/runs/1/ckpt/state.pt",
    )
    share = {"HTTP_X_GYRE_SHARE": world["share"]}
    seen = world["anon"].get(f"/api/runs/{run.pk}/", **share).json()
    assert seen["checkpoint_path"] == "" and seen["error"] == "OSError: cannot read <path>"
    assert world["anon"].get(f"/api/trees/{tree.pk}/", **share).json()["payload_path"] == ""
    member = world["member"].get(f"/api/runs/{run.pk}/").json()
    assert member["checkpoint_path"] == "/srv/gyre/runs/1/ckpt" and "x.py" in member["error"]
    assert world["member"].get(f"/api/trees/{tree.pk}/").json()["payload_path"]


# ----------------------------------------------------------------------------- imports


def _line(**changes: Any) -> dict[str, Any]:
    obj = json.loads(_good_jsonl().splitlines()[0])
    obj.update(changes, rollout_id="hostile", group_id="hostile")
    return obj


def _with_call(**changes: Any) -> dict[str, Any]:
    obj = _line()
    obj["calls"][0].update(changes)
    return obj


def _text(obj: dict[str, Any], raw: str = "") -> bytes:
    return json.dumps(obj).replace('"@RAW@"', raw).encode()


IMPORTS = [
    ("progress 1e400", lambda: _text(_line(progress="@RAW@"), "1e400"), "progress"),
    ("log-prob 1e400", lambda: _text(_with_call(logprobs=["@RAW@"] * len(
        _line()["calls"][0]["completion_ids"])), "1e400"), "calls[0].logprobs"),
    ("5,000-digit integer", lambda: _text(_line(progress="@RAW@"), BIG_INT), "<line>"),
    ("nested 100,000 deep", lambda: _text(_line(progress="@RAW@"),
                                          "[" * 100_000 + "]" * 100_000), "<line>"),
    ("rollout_id of 101", lambda: json.dumps({**_line(), "rollout_id": "r" * 101}).encode(),
     "rollout_id"),
    ("task_id of 201", lambda: _text(_line(task_id="t" * 201)), "task_id"),
    ("NUL in rollout_id", lambda: json.dumps({**_line(), "rollout_id": "a\x00"}).encode(),
     "rollout_id"),
    ("NUL in task_id", lambda: _text(_line(task_id="a\x00b")), "task_id"),
    ("20 MB line", lambda: _text(_line(pad="x" * 20 * 2**20)), "<line>"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "field"), [r[1:] for r in IMPORTS], ids=[r[0] for r in IMPORTS])
def test_import_refuses_with_line_and_field_and_keeps_no_file(world, make, field):
    run = world["run"]
    folder = Path(settings.GYRE_RUNS_DIR) / str(run.pk) / "imports"
    before = sorted(folder.iterdir())
    good = _good_jsonl(groups=2).splitlines()[-1]  # a rollout of another group: line 1 is fine
    resp = _upload(world["member"], run.pk, good + b"\n" + make() + b"\n")
    assert resp.status_code == 400, resp.content[:300]
    assert resp["Content-Type"].startswith("application/json")
    body = resp.json()
    assert (body["line"], body["field"]) == (2, field), body
    assert sorted(folder.iterdir()) == before  # the upload is gone
    assert run.rollouts.count() == 2  # only the fixture's


def test_import_over_the_size_bound_is_refused_naming_the_file(world, settings):
    settings.GYRE_IMPORT_MAX_BYTES = 1000
    run = world["run"]
    folder = Path(settings.GYRE_RUNS_DIR) / str(run.pk) / "imports"
    before = sorted(folder.iterdir())
    resp = _upload(world["member"], run.pk, _good_jsonl(groups=2))
    assert resp.status_code == 400 and resp.json()["field"] == "file"
    assert sorted(folder.iterdir()) == before
