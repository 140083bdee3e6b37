"""Hostile input, one row each: every answer is a 4xx JSON body naming the offending field
(never HTML, never a 500). REST rows name a key path of the body; import rows the
``line`` and ``field`` of the reader; dataset upload rows the line (or Parquet row) and
field in the message under ``file``; a failed import or upload leaves no file behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from gyre_web.runs import services
from gyre_web.teams import services as teams

from tests.platform.conftest import SIM_CONFIG
from tests.platform.uploads import synth_jsonl

pytestmark = pytest.mark.django_db

DEEP_1000 = "[" * 1000 + "]" * 1000
DEEP_100K = "[" * 100_000 + "]" * 100_000
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
    return {
        "exp": exp,
        "run": run,
        "tree": tree,
        "member": member,
        "share": share,
        "sim_config": sim_config,
        "anon": client_for(),
    }


def _good_jsonl(groups: int = 1) -> bytes:
    return synth_jsonl(groups=groups, seed=3)


def _upload(client: Any, run_id: int, data: bytes) -> Any:
    file = SimpleUploadedFile("t.jsonl", data, content_type="application/jsonl")
    return client.post(f"/api/runs/{run_id}/import/", {"file": file}, format="multipart")


def _config(w: dict[str, Any], **changes: Any) -> str:
    """A run-create body as JSON text; a value "@RAW@" is replaced by raw JSON later."""
    return json.dumps({"experiment": w["exp"].pk, "config": {**w["sim_config"], **changes}})


def _raw(body: str, raw: str) -> str:
    return body.replace('"@RAW@"', raw)


def _post(name: str, path: str, body: Any, field: tuple[str, ...]) -> Any:
    return pytest.param("post", path, body, "member", field, id=name)


def _get(name: str, path: str, field: tuple[str, ...], who: str = "member") -> Any:
    return pytest.param("get", path, None, who, field, id=name)


def _exp(w: dict[str, Any], **fields: Any) -> str:
    return json.dumps({"team": w["exp"].team_id, "name": "x", **fields})


def _run(w: dict[str, Any], **fields: Any) -> str:
    return json.dumps({"experiment": w["exp"].pk, "config": w["sim_config"], **fields})


RUNS, FORK = "/api/runs/", "/api/runs/{run}/fork/"
SIM_SPEED = {**SIM_CONFIG["sim"], "speed": "@RAW@"}
# Each row: the request, and the key path (into the JSON body) that must name the field.
REST = [
    _post("tags NUL", "/api/experiments/", lambda w: _exp(w, tags=["a\x00"]), ("tags",)),
    _post("experiment name NUL", "/api/experiments/", lambda w: _exp(w, name="a\x00"), ("name",)),
    _post("run name NUL", RUNS, lambda w: _run(w, name="a\x00"), ("name",)),
    _post("run name 1 MB", RUNS, lambda w: _run(w, name="n" * 2**20), ("name",)),
    _post("config string NUL", RUNS, lambda w: _config(w, name="a\x00"), ("config", "name")),
    _post("config.name 1 MB", RUNS, lambda w: _config(w, name="n" * 2**20), ("config", "name")),
    _post("steps 2^31", RUNS, lambda w: _config(w, steps=2**31), ("config", "steps")),
    _post("seed 2^63", RUNS, lambda w: _config(w, seed=2**63), ("config", "seed")),
    _post(
        "cluster.units 10^6",
        RUNS,
        lambda w: _config(w, cluster={"units": 10**6}),
        ("config", "cluster.units"),
    ),
    _post(
        "sim.speed 1e400",
        RUNS,
        lambda w: _raw(_config(w, sim=SIM_SPEED), "1e400"),
        ("config.sim.speed",),
    ),
    _post(
        "cluster.units 1e400",
        RUNS,
        lambda w: _raw(_config(w, cluster={"units": "@RAW@"}), "1e400"),
        ("config.cluster.units",),
    ),
    _post("5,000-digit steps", RUNS, lambda w: _raw(_config(w, steps="@RAW@"), BIG_INT), ("body",)),
    _post(
        "nested 1,000 deep", RUNS, lambda w: _raw(_config(w, name="@RAW@"), DEEP_1000), ("body",)
    ),
    _post(
        "fork nested 1,000 deep",
        FORK,
        lambda w: _raw(json.dumps({"changes": {"name": "@RAW@"}}), DEEP_1000),
        ("body",),
    ),
    _post(
        "fork steps 2^31",
        FORK,
        lambda w: json.dumps({"changes": {"steps": 2**31}}),
        ("config", "steps"),
    ),
    _post("5 MB JSON body", RUNS, lambda w: _config(w, name="n" * 5 * 2**20), ("body",)),
    _post(
        "team slug taken",
        "/api/teams/",
        lambda w: json.dumps({"name": "Other", "slug": w["exp"].team.slug}),
        ("slug",),
    ),
    # A lone surrogate is valid JSON but no text (psycopg cannot encode it): refused at the
    # parser, naming its key path, wherever JSON enters.
    _post(
        "tag lone surrogate", "/api/experiments/", lambda w: _exp(w, tags=["\ud800"]), ("tags[0]",)
    ),
    _post(
        "config string lone surrogate",
        RUNS,
        lambda w: _config(w, name="a\udfff"),
        ("config.name",),
    ),
    _post(
        "config key lone surrogate",
        RUNS,
        lambda w: _config(w, sim={**SIM_CONFIG["sim"], "\ud800": 1}),
        ("config.sim.\\ud800",),
    ),
    _post(
        "report config lone surrogate",
        "/api/runs/report/",
        lambda w: _config(w, name="\ud800"),
        ("config.name",),
    ),
    _post(
        "fork changes lone surrogate",
        FORK,
        lambda w: json.dumps({"changes": {"name": "\ud800"}}),
        ("changes.name",),
    ),
    _post(
        "sweep params lone surrogate",
        "/api/sweeps/",
        lambda w: json.dumps(
            {
                "experiment": w["exp"].pk,
                "base_config": w["sim_config"],
                "mode": "grid",
                "params": {"name": ["a", "\ud800"]},
            }
        ),
        ("params.name[1]",),
    ),
    _get("metrics names NUL", "/api/runs/{run}/metrics/?names=%00", ("names",)),
    _get(
        "metrics names NUL, share link",
        "/api/runs/{run}/metrics/?names=%00",
        ("names",),
        who="share",
    ),
    _get("compare names NUL", "/api/runs/metrics/?runs={run}&names=a%00", ("names",)),
    _get("search q NUL, share link", "/api/trees/{tree}/search/?q=%00", ("q",), who="share"),
    _get(
        "nodes parent superscript",
        "/api/trees/{tree}/nodes/?parent=%C2%B2",
        ("parent",),
        who="share",
    ),
    _get("unknown API path", "/api/no-such-thing/", ("detail",)),
]


def _names(body: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(body, dict) or key not in body:
            return False
        body = body[key]
    return True


@pytest.mark.parametrize(("method", "path", "body", "who", "field"), REST)
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
    resp = world["member"].post(
        "/api/experiments/", data=body, content_type="application/x-www-form-urlencoded"
    )
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
    assert "checkpoint_path" not in seen and seen["error"] == "OSError: cannot read <path>"
    assert "payload_path" not in world["anon"].get(f"/api/trees/{tree.pk}/", **share).json()
    member = world["member"].get(f"/api/runs/{run.pk}/").json()
    assert "checkpoint_path" not in member and "x.py" in member["error"]  # see test_server_paths
    assert "payload_path" not in world["member"].get(f"/api/trees/{tree.pk}/").json()


# ----------------------------------------------------------------------------- imports


def _line(**changes: Any) -> dict[str, Any]:
    obj = json.loads(_good_jsonl().splitlines()[0])
    obj.update({"rollout_id": "hostile", "group_id": "hostile", **changes})
    return obj


def _with_call(**changes: Any) -> dict[str, Any]:
    obj = _line()
    obj["calls"][0].update(changes)
    return obj


def _text(obj: dict[str, Any], raw: str = "") -> bytes:
    return json.dumps(obj).replace('"@RAW@"', raw).encode()


def _bad(name: str, line: Any, raw: str, field: str) -> Any:
    return pytest.param(lambda: _text(line(), raw), field, id=name)


def _logprobs() -> dict[str, Any]:
    return _with_call(logprobs=["@RAW@"] * len(_line()["calls"][0]["completion_ids"]))


IMPORTS = [
    _bad("progress 1e400", lambda: _line(progress="@RAW@"), "1e400", "progress"),
    _bad("log-prob 1e400", _logprobs, "1e400", "calls[0].logprobs"),
    _bad("5,000-digit integer", lambda: _line(progress="@RAW@"), BIG_INT, "<line>"),
    _bad("nested 100,000 deep", lambda: _line(progress="@RAW@"), DEEP_100K, "<line>"),
    _bad("rollout_id of 101", lambda: _line(rollout_id="r" * 101), "", "rollout_id"),
    _bad("task_id of 201", lambda: _line(task_id="t" * 201), "", "task_id"),
    _bad("NUL in rollout_id", lambda: _line(rollout_id="a\x00"), "", "rollout_id"),
    _bad("NUL in task_id", lambda: _line(task_id="a\x00b"), "", "task_id"),
    _bad("lone surrogate in rollout_id", lambda: _line(rollout_id="\ud800"), "", "rollout_id"),
    _bad("lone surrogate in task_id", lambda: _line(task_id="a\udc00"), "", "task_id"),
    _bad("lone surrogate in group_id", lambda: _line(group_id="\udbff"), "", "group_id"),
    _bad("20 MB line", lambda: _line(pad="x" * 20 * 2**20), "", "<line>"),
]


@pytest.mark.parametrize(("make", "field"), IMPORTS)
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


def test_django_level_errors_are_json_under_api_and_html_elsewhere(world):
    from django.test import RequestFactory
    from gyre_web import inputs

    rf = RequestFactory()
    api, page = rf.get("/api/runs/1/"), rf.get("/runs/1")
    boom = RuntimeError("/srv/gyre/secret.py line 3")
    for handler, code in [
        (inputs.bad_request, 400),
        (inputs.permission_denied, 403),
        (inputs.page_not_found, 404),
    ]:
        resp = handler(api, boom)
        assert (resp.status_code, resp["Content-Type"]) == (code, "application/json")
        assert handler(page, boom)["Content-Type"].startswith("text/html")
    resp = inputs.server_error(api)
    assert resp.status_code == 500 and json.loads(resp.content) == {
        "detail": "server error (logged)"
    }
    assert inputs.server_error(page)["Content-Type"].startswith("text/html")


def _parquet_with(value: str) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{"id": "ok"}, {"id": value}]), buf)
    return buf.getvalue()


DATASETS = [  # (what, kind, file bytes, where the problem is: in the answer's message)
    ("1e400", "tasks", b'{"id": 1}\n{"x": 1e400}\n', "line 2: x"),
    ("5,000-digit integer", "tasks", b'{"id": 1}\n{"x": ' + BIG_INT.encode() + b"}\n", "line 2"),
    ("nested 100,000 deep", "tasks", b'{"id": 1}\n{"x": ' + DEEP_100K.encode() + b"}\n", "line 2"),
    ("20 MB line", "tasks", b'{"id": 1}\n{"x": "' + b"x" * 20 * 2**20 + b'"}\n', "line 2"),
    ("escaped NUL", "tasks", b'{"id": 1}\n{"x": "\\u0000"}\n', "line 2: x"),
    ("lone surrogate", "tasks", b'{"id": 1}\n{"x": ["\\udbff"]}\n', "line 2: x[0]"),
    ("NUL in a Parquet string", "tasks", _parquet_with("a\x00b"), "row 2: id"),
    ("not UTF-8", "tasks", b'{"id": 1}\n{"x": "\xff"}\n', "line 2"),
    ("a number", "tasks", b"7\n", "line 1"),
    ("trajectory progress 1e400", "trajectories",
     _good_jsonl().replace(b'"progress":', b'"progress":1e400,"x":'), "line 1: progress"),
    ("trajectory NUL in an unknown key", "trajectories",
     _good_jsonl().replace(b'{"format"', b'{"sh\\u0000":1,"format"', 1), "line 1"),
    ("message log with a lone surrogate", "trajectories",
     b'{"messages": [{"role": "user", "content": "\\ud800"}]}\n', "line 1: messages[0].content"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "kind", "data", "where"), DATASETS, ids=[d[0] for d in DATASETS])
def test_dataset_upload_refuses_by_field_and_keeps_no_file(people, world, what, kind, data, where):
    folder = Path(settings.GYRE_DATA_DIR) / "datasets"
    before = sorted(folder.rglob("*")) if folder.exists() else []
    file = SimpleUploadedFile("d.jsonl", data)
    body = {"file": file, "name": what, "kind": kind, "team": people["team"].pk}
    resp = world["member"].post("/api/datasets/", body, format="multipart")
    assert resp.status_code == 400, resp.content[:300]
    assert resp["Content-Type"].startswith("application/json")
    problem = resp.json()["file"][0]
    assert problem.startswith(where), problem
    assert str(settings.GYRE_DATA_DIR) not in problem
    after = sorted(p for p in folder.rglob("*") if p not in before and p.is_file())
    assert after == []  # the upload is gone
