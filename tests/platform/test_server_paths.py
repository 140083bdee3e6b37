"""No API response carries the data folder (``GYRE_DATA_DIR``) to anyone, and readers
outside a run's team (a share link, a signed-in outsider on a public experiment) see no
absolute server path at all: every read endpoint of a run is walked for each role, the
outsider and both kinds of share link, with server paths planted where the worker and
the importer put them (the run's error and checkpoint folder, its log lines, a tree's
payload file, a ``rollouts_written`` event's file, an export's error)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from gyre_web.runs import services
from gyre_web.runs.logs import append_log_lines
from gyre_web.runs.models import CheckpointExport, Run
from gyre_web.teams import services as teams

from tests.platform.uploads import synth_jsonl

pytestmark = pytest.mark.django_db

ELSEWHERE = "/opt/gyre-install/site-packages/gyre_core/runtime.py"  # a path outside the data dir


@pytest.fixture
def world(people, sim_config, client_for) -> dict[str, Any]:
    exp = services.create_experiment(team=people["team"], name="paths", visibility="public")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    file = SimpleUploadedFile("t.jsonl", synth_jsonl(groups=1, seed=3))
    resp = client_for(people["member"]).post(
        f"/api/runs/{run.pk}/import/", {"file": file}, format="multipart"
    )
    assert resp.status_code == 201, resp.content
    data = str(settings.GYRE_DATA_DIR)
    ckpt = f"{data}/runs/{run.pk}/checkpoints/step-2/state.pt"
    assert run.trees.get().payload_path.startswith(data)  # the importer's file is there
    Run.objects.filter(pk=run.pk).update(
        checkpoint_path=f"{data}/runs/{run.pk}",
        error=f'Traceback (most recent call last):\n  File "{ELSEWHERE}", line 3\n'
        f"OSError: cannot read {ckpt}",
    )
    append_log_lines(
        run_id=run.pk,
        lines=[
            {"source": "runtime", "level": "info", "text": f"saved {ckpt} via {ELSEWHERE}"},
        ],
    )
    CheckpointExport.objects.create(run=run, version=2, status="failed", error=f"no {ckpt}")
    written = {"step": 2, "path": f"{data}/runs/{run.pk}/payloads/step-2.jsonl", "rollouts": 0,
               "groups": []}  # fmt: skip
    services.append_events(
        run_id=run.pk, events=[{"kind": "rollouts_written", "t": 1.0, "data": written}]
    )
    _, run_link = teams.create_share_link(created_by=people["owner"], run=run)
    _, exp_link = teams.create_share_link(created_by=people["owner"], experiment=exp)
    return {"run": run, "exp": exp, "tree": run.trees.get(), "run_link": run_link,
            "exp_link": exp_link}  # fmt: skip


def _urls(w: dict[str, Any]) -> list[str]:
    run, tree = w["run"].pk, w["tree"].pk
    return [
        f"/api/experiments/{w['exp'].pk}/",
        f"/api/runs/?experiment={w['exp'].pk}",
        f"/api/runs/{run}/",
        f"/api/runs/{run}/logs/",
        f"/api/runs/{run}/events/",
        f"/api/runs/{run}/checkpoints/",
        f"/api/runs/{run}/checkpoints/2/export/",
        f"/api/rollouts/?run={run}",
        f"/api/trees/?run={run}",
        f"/api/trees/{tree}/",
        f"/api/trees/{tree}/nodes/",
    ]


def _walk(client: Any, urls: list[str], extra: dict[str, str]) -> dict[str, str]:
    seen = {}
    for url in urls:
        resp = client.get(url, **extra)
        assert resp.status_code in (200, 403, 404), (url, resp.status_code, resp.content[:200])
        seen[url] = resp.content.decode()
    assert any("<data>" in t or "<path>" in t for t in seen.values())  # the walk saw them
    return seen


INSIDERS = ["owner", "admin", "member", "viewer"]
OUTSIDERS = ["outsider", "run_link", "exp_link"]


@pytest.mark.parametrize("who", INSIDERS + OUTSIDERS)
def test_no_response_carries_a_server_path(world, people, client_for, who):
    data = str(settings.GYRE_DATA_DIR)
    if who.endswith("_link"):
        client, extra = client_for(), {"HTTP_X_GYRE_SHARE": world[who]}
    else:
        client, extra = client_for(people[who]), {}
    seen = _walk(client, _urls(world), extra)
    assert seen[f"/api/runs/{world['run'].pk}/"].count("OSError: cannot read") == 1
    assert '"path":"step-2.jsonl"' in seen[f"/api/runs/{world['run'].pk}/events/"]
    for url, text in seen.items():
        assert data not in text, (who, url, text[:300])
        assert "checkpoint_path" not in text and "payload_path" not in text, (who, url)
        if who in OUTSIDERS:  # no absolute path at all, and the error as its last line
            assert ELSEWHERE not in text, (who, url, text[:300])
    run = client.get(f"/api/runs/{world['run'].pk}/", **extra).json()
    if who in INSIDERS:  # the traceback stays readable, the data folder as <data>
        assert ELSEWHERE in run["error"] and "<data>/runs/" in run["error"]
    else:
        assert run["error"] == "OSError: cannot read <path>"
