"""A run checkpoint exported as a Hugging Face directory from the platform: a member's
POST queues it, a real Celery worker runs `gyre export` in a subprocess, the status goes
queued -> running -> done, and the tar it offers loads with transformers'
AutoModelForCausalLM with the checkpoint's weights. Viewers and share links cannot export
(a viewer downloads a done one, a share link neither); a failed export says why without
the server's paths, and asking again queues it again."""

from __future__ import annotations

import io
import shutil
import tarfile
import time

import pytest
import torch
from gyre_web.runs import services
from gyre_web.teams import services as teams
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.cli.test_export_cli import run_folder
from tests.platform.test_workers import worker  # noqa: F401 (fixture)
from tests.platform.uploads import fake_checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="export")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    run_folder(services.run_dir(run.pk))  # model/ and real checkpoints of versions 1, 2
    yield run
    shutil.rmtree(services.run_dir(run.pk), ignore_errors=True)


def _until(client, url: str, statuses: set[str], timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = client.get(url)
        assert got.status_code == 200, got.content
        if got.json()["status"] in statuses:
            return got.json()
        assert time.monotonic() < deadline, f"export still {got.json()['status']}"
        time.sleep(0.3)


def test_a_member_exports_a_checkpoint_that_transformers_loads(
    worker,  # noqa: F811
    run,
    people,
    client_for,
    tmp_path,
):
    url = f"/api/runs/{run.pk}/checkpoints/2/export/"
    member, viewer = client_for(people["member"]), client_for(people["viewer"])
    assert viewer.post(url).status_code == 403
    _, key = teams.create_share_link(created_by=people["owner"], run=run)
    anon = client_for()
    assert anon.post(url, HTTP_X_GYRE_SHARE=key).status_code == 403
    assert client_for(people["outsider"]).post(url).status_code == 404
    assert member.post(f"/api/runs/{run.pk}/checkpoints/7/export/").status_code == 404

    asked = member.post(url)
    assert asked.status_code == 202 and asked.json()["status"] in ("queued", "running", "done")
    done = _until(member, url, {"done", "failed"})
    assert done["status"] == "done", done["error"]
    assert done["size_bytes"] > 0 and done["finished_at"]
    listed = viewer.get(f"/api/runs/{run.pk}/checkpoints/").json()
    assert [c["export"] and c["export"]["status"] for c in listed] == [None, "done"]
    assert member.post(url).json()["finished_at"] == done["finished_at"]  # not run again

    got = viewer.get(url + "download/")
    assert got.status_code == 200 and "hf-step-00000002" in got["Content-Disposition"]
    with tarfile.open(fileobj=io.BytesIO(b"".join(got.streaming_content))) as tar:
        tar.extractall(tmp_path, filter="data")
    out = tmp_path / "hf-step-00000002"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    ckpt = services.run_dir(run.pk) / "checkpoints" / "step-00000002" / "model.safetensors"
    want = load_file(str(ckpt))
    assert want and all(torch.equal(loaded[k], v.to(torch.bfloat16)) for k, v in want.items())

    assert anon.get(url + "download/", HTTP_X_GYRE_SHARE=key).status_code == 403
    assert anon.get(url, HTTP_X_GYRE_SHARE=key).status_code == 403
    assert member.get(f"/api/runs/{run.pk}/checkpoints/1/export/download/").status_code == 404


def test_a_failed_export_says_why_and_is_queued_again(worker, people, client_for, sim_config):  # noqa: F811
    exp = services.create_experiment(team=people["team"], name="broken")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    fake_checkpoint(run.pk, 1)  # not a loadable checkpoint, and no model folder
    url = f"/api/runs/{run.pk}/checkpoints/1/export/"
    member = client_for(people["member"])
    try:
        assert member.post(url).status_code == 202
        failed = _until(member, url, {"done", "failed"})
        assert failed["status"] == "failed" and failed["error"]
        assert str(services.run_dir(run.pk)) not in failed["error"]
        assert member.get(url + "download/").status_code == 404
        again = member.post(url)
        assert again.status_code == 202 and again.json()["status"] in (
            "queued",
            "running",
            "failed",
        )
        assert again.json()["error"] in ("", failed["error"])
    finally:
        shutil.rmtree(services.run_dir(run.pk), ignore_errors=True)
