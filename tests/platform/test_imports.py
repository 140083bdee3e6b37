"""Import of gyre.trajectory/v1 JSONL files into a run's rollouts and trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from gyre_web.runs import services
from gyre_web.trajectories.models import Rollout, Tree

from tests.platform.uploads import synth_jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="imports")
    return services.create_run(experiment=exp, config=sim_config, launch=False)


def _jsonl() -> bytes:
    return synth_jsonl(groups=2, group_size=3, turns=3, prompt=64, completion=16, retry_prob=0.3)


def _upload(client, run_id: int, data: bytes):
    file = SimpleUploadedFile("t.jsonl", data, content_type="application/jsonl")
    return client.post(f"/api/runs/{run_id}/import/", {"file": file}, format="multipart")


def test_import_builds_rollouts_and_trees_with_lazy_nodes(run, people, client_for):
    member = client_for(people["member"])
    resp = _upload(member, run.pk, _jsonl())
    assert resp.status_code == 201, resp.content
    counts = resp.json()
    assert counts["rollouts"] == 6 and counts["trees"] == 2 and counts["nodes"] >= 2
    assert Rollout.objects.filter(run=run).count() == 6
    tree = Tree.objects.filter(run=run).first()
    assert tree.rollouts == 3 and tree.tokens_per_call > tree.tokens_unique  # shared prefixes
    roots = member.get(f"/api/trees/{tree.pk}/nodes/").json()["results"]
    assert len(roots) == 1 and roots[0]["preview"].startswith("[")  # token ids, no tokenizer
    assert roots[0]["leaves"] >= 3  # every rollout ends below the shared system prompt
    kids = member.get(f"/api/trees/{tree.pk}/nodes/?parent={roots[0]['id']}").json()["results"]
    assert all(k["depth"] == 1 for k in kids) and kids
    again = _upload(member, run.pk, _jsonl())
    assert again.status_code == 400 and again.json()["field"] == "rollout_id"


def test_malformed_lines_are_answered_400_with_line_and_field(run, people, client_for):
    member = client_for(people["member"])
    lines = _jsonl().decode().splitlines()
    broken = json.loads(lines[1])
    broken["progress"] = 7
    bad = "\n".join([lines[0], json.dumps(broken)]).encode()
    resp = _upload(member, run.pk, bad)
    assert resp.status_code == 400
    assert resp.json()["line"] == 2 and resp.json()["field"] == "progress"
    resp = _upload(member, run.pk, b"{not json\n")
    assert resp.status_code == 400 and resp.json()["line"] == 1
    assert not Rollout.objects.filter(run=run).exists()
    assert client_for(people["viewer"]).post(f"/api/runs/{run.pk}/import/").status_code == 403


def test_the_stored_file_keeps_only_the_known_fields(run, people, client_for):
    """An import line's unknown keys (top level and per call) are not stored: the kept
    payload is rewritten from what the reader parsed (issue: "sh", "-c", "id > out.txt"
    kept in the file and later run as a command)."""
    member = client_for(people["member"])
    lines = [json.loads(line) for line in _jsonl().decode().splitlines()]
    for obj in lines:
        obj.update({"sh": "-c", "-c": "id > out.txt", "extra": {"nested": 1}})
        obj["calls"][0]["cmd"] = ["sh", "-c", "id"]
    sent = "\n".join(json.dumps(obj) for obj in lines).encode()
    resp = _upload(member, run.pk, sent)
    assert resp.status_code == 201, resp.content
    paths = set(Rollout.objects.filter(run=run).values_list("payload_path", flat=True))
    paths |= set(Tree.objects.filter(run=run).values_list("payload_path", flat=True))
    assert len(paths) == 1
    stored = [json.loads(line) for line in Path(paths.pop()).read_text().splitlines() if line]
    top = {"format", "rollout_id", "task_id", "group_id", "status", "progress", "reward", "calls"}
    per_call = {"call_id", "agent", "kind", "prefix", "prompt_ids", "completion_ids",
                "logprobs", "versions"}  # fmt: skip
    assert [o["rollout_id"] for o in stored] == [o["rollout_id"] for o in lines]
    for got, given in zip(stored, lines, strict=True):
        assert set(got) <= top, set(got) - top
        assert all(set(c) <= per_call for c in got["calls"])
        for key in ("task_id", "group_id", "status", "progress", "reward"):
            assert got[key] == given[key]
        for a, b in zip(got["calls"], given["calls"], strict=True):  # tokens kept exactly
            for key in ("prompt_ids", "completion_ids", "logprobs", "call_id", "prefix"):
                assert a.get(key) == b.get(key), key
    tree = Tree.objects.filter(run=run).first()
    node = tree.tree_nodes.order_by("id").first()
    tokens = member.get(f"/api/trees/{tree.pk}/nodes/{node.pk}/tokens/").json()
    assert tokens["payload"] is True and tokens["ids"]
