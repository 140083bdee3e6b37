"""Dataset uploads (``/api/datasets/``): what each role may do, what outsiders and share
links see (404), what a file must be (400 naming the field), that a failed upload leaves
no file, that answers show no server path, and ``dataset_path``'s team isolation."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from gyre_web.datasets.models import Dataset
from gyre_web.datasets.selectors import dataset_kind, dataset_path
from gyre_web.teams import services as teams
from rest_framework.test import APIClient

from tests.platform.uploads import synth_jsonl

pytestmark = pytest.mark.django_db
TASKS = b'{"id": "t1", "prompt": "add 2 and 2"}\n{"id": "t2", "split": "heldout"}\n'
CHAT = (
    json.dumps(
        {
            "id": "ep-1",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "token_ids": [5, 6],
                 "logprobs": [-0.1, -0.2]},
            ],
            "reward": 1.0,
        }
    ).encode()
    + b"\n"
)  # fmt: skip
FIELDS = {
    "id", "team", "name", "kind", "format", "size", "sha256", "rows", "created_by", "created_at"
}  # fmt: skip


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _post(client: APIClient, team: int, data: bytes, kind: str = "tasks", **more: Any) -> Any:
    body = {"file": SimpleUploadedFile(more.pop("filename", "t.jsonl"), data), "name": "d"}
    body.update(kind=kind, team=team, **more)
    return client.post("/api/datasets/", body, format="multipart")


def _files() -> list[Path]:
    root = Path(settings.GYRE_DATA_DIR) / "datasets"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def clients(people, client_for) -> dict[str, APIClient]:
    out = {who: client_for(people[who]) for who in ("owner", "admin", "member", "viewer")}
    out["outsider"] = client_for(people["outsider"])
    return out


def _share_client(people: dict[str, Any]) -> APIClient:
    from gyre_web.runs import services as runs

    exp = runs.create_experiment(team=people["team"], name="shared")
    _, key = teams.create_share_link(created_by=people["owner"], experiment=exp)
    return APIClient(HTTP_X_GYRE_SHARE=key)


def test_roles_upload_list_read_and_delete(people, clients, django_capture_on_commit_callbacks):
    team = people["team"].pk
    made = {}
    for who in ("owner", "admin", "member"):
        resp = _post(clients[who], team, TASKS)
        assert resp.status_code == 201, (who, resp.content)
        body = resp.json()
        assert set(body) == FIELDS and body["rows"] == 2 and body["kind"] == "tasks"
        assert body["created_by"] == who and body["format"] == "jsonl"
        assert body["size"] == len(TASKS)
        assert body["sha256"] == hashlib.sha256(TASKS).hexdigest()
        made[who] = body["id"]
    assert _post(clients["viewer"], team, TASKS).status_code == 403
    for who in ("owner", "admin", "member", "viewer"):
        listed = clients[who].get(f"/api/datasets/?team={team}").json()["results"]
        assert [d["id"] for d in listed] == sorted(made.values(), reverse=True)
        assert clients[who].get(f"/api/datasets/{made['owner']}/").status_code == 200
    assert clients["viewer"].delete(f"/api/datasets/{made['owner']}/").status_code == 403
    path = dataset_path(team_id=team, dataset_id=made["owner"])
    assert path.is_file()
    with django_capture_on_commit_callbacks(execute=True):
        assert clients["member"].delete(f"/api/datasets/{made['owner']}/").status_code == 204
    assert not path.exists() and not Dataset.objects.filter(pk=made["owner"]).exists()
    assert clients["owner"].delete(f"/api/datasets/{made['admin']}/").status_code == 204


def test_outsiders_and_share_links_find_nothing(people, clients):
    team = people["team"].pk
    ds = _post(clients["member"], team, TASKS).json()["id"]
    share = _share_client(people)
    for client in (clients["outsider"], share):
        assert client.get(f"/api/datasets/{ds}/").status_code == 404
        assert client.delete(f"/api/datasets/{ds}/").status_code == 404
    assert clients["outsider"].get(f"/api/datasets/?team={team}").json()["results"] == []
    assert share.get("/api/datasets/").status_code == 404
    assert _post(share, team, TASKS).status_code == 404
    refused = _post(clients["outsider"], team, TASKS)  # a team it is not in: no such team
    assert refused.status_code == 400 and "team" in refused.json()
    assert APIClient().get("/api/datasets/").status_code == 401
    assert Dataset.objects.count() == 1


def test_kinds_and_formats_are_read_from_the_content(people, clients):
    c, team = clients["member"], people["team"].pk
    parquet = _post(c, team, _parquet([{"id": "a", "n": 1}, {"id": "b", "n": 2}]))
    assert parquet.status_code == 201, parquet.content
    assert parquet.json()["format"] == "parquet" and parquet.json()["rows"] == 2
    path = dataset_path(team_id=team, dataset_id=parquet.json()["id"])
    assert path.suffix == ".parquet"  # the reader picks Parquet by suffix
    traj = _post(c, team, synth_jsonl(groups=2), kind="trajectories", filename="../../x.sh")
    assert traj.status_code == 201, traj.content
    assert traj.json()["format"] == "trajectory" and traj.json()["rows"] == 4
    stored = dataset_path(team_id=team, dataset_id=traj.json()["id"])
    assert stored.parent == Path(settings.GYRE_DATA_DIR) / "datasets" / str(team)
    assert "x.sh" not in stored.name and stored.suffix == ".jsonl"
    chat = _post(c, team, CHAT, kind="trajectories")
    assert chat.status_code == 201 and chat.json()["format"] == "chat_log", chat.content
    assert dataset_kind(team_id=team, dataset_id=chat.json()["id"]) == "trajectories"
    for body in (parquet.json(), traj.json(), chat.json()):
        assert str(settings.GYRE_DATA_DIR) not in json.dumps(body)
    listing = c.get(f"/api/datasets/?team={team}&kind=trajectories").json()["results"]
    assert {d["id"] for d in listing} == {traj.json()["id"], chat.json()["id"]}
    assert str(settings.GYRE_DATA_DIR) not in json.dumps(listing)


BAD = [  # (what, kind, bytes, extra form fields, refused field)
    ("unknown kind", "weights", TASKS, {}, "kind"),
    ("no name", "tasks", TASKS, {"name": ""}, "name"),
    ("NUL in the name", "tasks", TASKS, {"name": "a\x00b"}, "name"),
    ("empty file", "tasks", b"", {}, "file"),
    ("not JSON", "tasks", b"{not json}\n", {}, "file"),
    ("a list, not a task", "tasks", b"[1, 2]\n", {}, "file"),
    ("no task", "tasks", b"\n\n", {}, "file"),
    ("escaped NUL", "tasks", b'{"id": "a\\u0000b"}\n', {}, "file"),
    ("NUL in a key", "tasks", b'{"a\\u0000": 1}\n', {}, "file"),
    ("lone surrogate", "tasks", b'{"id": "\\ud800"}\n', {}, "file"),
    ("raw NUL byte", "tasks", b'{"id": 1}\x00\n', {}, "file"),
    ("not UTF-8", "tasks", b'{"id": "\xed\xa0\x80"}\n', {}, "file"),
    ("non-finite", "tasks", b'{"x": 1e400}\n', {}, "file"),
    ("broken Parquet", "tasks", b"PAR1" + b"\x00" * 64, {}, "file"),
    ("Parquet trajectories", "trajectories", b"PAR1" + b"\x00" * 64, {}, "file"),
    ("tasks as trajectories", "trajectories", TASKS, {}, "file"),
    ("bad call", "trajectories", synth_jsonl().replace(b'"logprobs":[', b'"logprobs":[1,'),
     {}, "file"),
    ("lone surrogate id", "trajectories",
     synth_jsonl().replace(b'"task_id":"', b'"task_id":"\\udfff', 1), {}, "file"),
    ("chat without assistant", "trajectories",
     b'{"messages": [{"role": "user", "content": "hi"}]}\n', {}, "file"),
    ("chat bad logprobs", "trajectories", CHAT.replace(b"-0.2", b"0.5"), {}, "file"),
    ("duplicate ids", "trajectories", CHAT + CHAT, {}, "file"),
]  # fmt: skip


@pytest.mark.parametrize("what,kind,data,more,field", BAD, ids=[b[0] for b in BAD])
def test_bad_uploads_are_refused_by_field_and_leave_nothing(
    people, clients, what, kind, data, more, field
):
    before = _files()  # earlier tests' files (their rows were rolled back)
    resp = _post(clients["member"], people["team"].pk, data, kind=kind, **more)
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert field in body, body
    assert str(settings.GYRE_DATA_DIR) not in json.dumps(body)
    assert Dataset.objects.count() == 0 and _files() == before


def test_a_file_over_the_limit_is_refused_and_leaves_nothing(people, clients, settings):
    settings.GYRE_DATASET_MAX_BYTES = 1000
    before = _files()
    resp = _post(clients["member"], people["team"].pk, b'{"id": "x"}\n' * 100)
    assert resp.status_code == 400 and "1000 bytes" in resp.json()["file"][0]
    assert Dataset.objects.count() == 0 and _files() == before
    assert _post(clients["member"], people["team"].pk, TASKS).status_code == 201


def test_dataset_path_is_the_teams_own(people, clients):
    mine = _post(clients["member"], people["team"].pk, TASKS).json()["id"]
    theirs = _post(clients["outsider"], people["other_team"].pk, TASKS).json()["id"]
    assert dataset_path(team_id=people["team"].pk, dataset_id=mine).is_file()
    for team, ds in ((people["team"].pk, theirs), (people["other_team"].pk, mine)):
        with pytest.raises(LookupError):
            dataset_path(team_id=team, dataset_id=ds)
        with pytest.raises(LookupError):
            dataset_kind(team_id=team, dataset_id=ds)
    with pytest.raises(LookupError):
        dataset_path(team_id=people["team"].pk, dataset_id=10**12)


def test_a_deleted_teams_files_go_with_it(people, clients, django_capture_on_commit_callbacks):
    ds = _post(clients["owner"], people["team"].pk, TASKS).json()["id"]
    kept = _post(clients["outsider"], people["other_team"].pk, TASKS).json()["id"]
    path = dataset_path(team_id=people["team"].pk, dataset_id=ds)
    with django_capture_on_commit_callbacks(execute=True):
        people["team"].delete()
    assert not path.exists() and not Dataset.objects.filter(pk=ds).exists()
    assert dataset_path(team_id=people["other_team"].pk, dataset_id=kept).is_file()


def test_a_staged_upload_left_by_a_killed_process_goes_a_day_later(people, clients):
    import os
    import time

    incoming = Path(settings.GYRE_DATA_DIR) / "datasets" / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    old, fresh = incoming / "old.part", incoming / "fresh.part"
    for part in (old, fresh):
        part.write_bytes(b"half an upload")
    day_ago = time.time() - 24 * 3600 - 60
    os.utime(old, (day_ago, day_ago))
    assert _post(clients["member"], people["team"].pk, TASKS).status_code == 201
    assert not old.exists() and fresh.exists()  # another upload may be writing this one
    fresh.unlink()


def test_the_stored_files_are_what_the_runs_readers_read(people, clients):
    """A tasks dataset reads with ``rollout.tasks``' reader (JSONL and Parquet: it picks
    Parquet by the stored name's suffix), a trajectories one with the warm start's."""
    from gyre_core.rollout.chat_log import is_chat_log
    from gyre_core.rollout.plugins import read_tasks
    from gyre_core.trajectory.format import read_rollouts

    c, team = clients["member"], people["team"].pk

    def stored(data: bytes, kind: str = "tasks", filename: str = "t.jsonl") -> Path:
        resp = _post(c, team, data, kind=kind, filename=filename)
        assert resp.status_code == 201, resp.content
        return dataset_path(team_id=team, dataset_id=resp.json()["id"])

    tasks = read_tasks(stored(TASKS, filename="tasks.parquet"))  # the name given is ignored
    assert [t["id"] for t in tasks["train"]] == ["t1"]
    assert [t["id"] for t in tasks["heldout"]] == ["t2"]
    rows = [{"id": "a", "split": "train"}, {"id": "b", "split": "heldout"}]
    from_parquet = read_tasks(stored(_parquet(rows), filename="tasks.jsonl"))
    assert [t["id"] for t in from_parquet["train"]] == ["a"]
    assert len(list(read_rollouts(stored(synth_jsonl(), kind="trajectories")))) == 2
    assert is_chat_log(stored(CHAT, kind="trajectories"))
