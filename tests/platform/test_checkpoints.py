"""A run's checkpoints on the platform: listed with step, version, size and the benchmark
at that step for anyone who reads the run; downloaded as a tar by the team's members
only (a share link reads the list, not the weights)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest
from gyre_web.runs import services
from gyre_web.runs.models import BenchmarkScore
from gyre_web.teams import services as teams

from tests.platform.uploads import fake_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_with_checkpoints(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="ckpt")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    fake_checkpoint(run.pk, 2)
    # no state.json: still being written, not listed
    (services.run_dir(run.pk) / "checkpoints" / "step-00000003").mkdir()
    BenchmarkScore.objects.create(run=run, step=2, suite="coding", score=0.5, tasks=4)
    yield run
    shutil.rmtree(services.run_dir(run.pk), ignore_errors=True)


def test_checkpoints_are_listed_and_download_as_a_tar(run_with_checkpoints, people, client_for):
    run = run_with_checkpoints
    viewer = client_for(people["viewer"])
    listed = viewer.get(f"/api/runs/{run.pk}/checkpoints/").json()
    assert [(c["step"], c["version"], c["benchmark"]) for c in listed] == [(2, 2, {"coding": 0.5})]
    assert listed[0]["size_bytes"] == 1000 + len(json.dumps({"version": 2}))
    got = viewer.get(f"/api/runs/{run.pk}/checkpoints/2/download/")
    assert got.status_code == 200 and "run-" in got["Content-Disposition"]
    with tarfile.open(fileobj=io.BytesIO(b"".join(got.streaming_content))) as tar:
        names = sorted(tar.getnames())
        weights = tar.extractfile("step-00000002/model.safetensors")
        assert weights is not None and weights.read() == b"\x01" * 1000
    assert names == ["step-00000002/model.safetensors", "step-00000002/state.json"]
    assert viewer.get(f"/api/runs/{run.pk}/checkpoints/3/download/").status_code == 404


def test_a_share_link_lists_but_does_not_download(run_with_checkpoints, people, client_for):
    run = run_with_checkpoints
    _, key = teams.create_share_link(created_by=people["owner"], run=run)
    anon = client_for()
    shared = {"HTTP_X_GYRE_SHARE": key}
    assert anon.get(f"/api/runs/{run.pk}/checkpoints/", **shared).status_code == 200
    assert anon.get(f"/api/runs/{run.pk}/checkpoints/2/download/", **shared).status_code == 403
    outsider = client_for(people["outsider"])
    assert outsider.get(f"/api/runs/{run.pk}/checkpoints/2/download/").status_code == 404
