"""Import of gyre.trajectory/v1 JSONL files into a run's rollouts and trees."""

from __future__ import annotations

import json

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
