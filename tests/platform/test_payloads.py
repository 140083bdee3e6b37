"""A live run's payload files: ``rollouts_written`` through the worker's sink makes the
rows an import makes (rollouts, trees, nodes, ``payload_path``), idempotently, and the
per-token endpoint reads the node's tokens back from the platform's copy of the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from django.conf import settings
from gyre_web.runs import services
from gyre_web.runs.models import MetricPoint, RunEvent
from gyre_web.teams import services as teams
from gyre_web.trajectories.models import Rollout, Tree, TreeNode

from gyre_core import events as ev
from gyre_core.models.tokenizer import train_tokenizer
from gyre_core.trajectory.format import Call
from gyre_core.trajectory.format import Rollout as CoreRollout
from gyre_core.trajectory.writer import write_rollouts
from workers.sink import DbSink

pytestmark = pytest.mark.django_db
TEXTS = ["def main():\n    return fix(bug)\n", "assert tests pass\n", "run the tool: pytest -q\n"]


@pytest.fixture
def tokenizer(tmp_path):
    tok = train_tokenizer(TEXTS * 20, vocab_size=300)
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return tok, folder


@pytest.fixture
def run(people, tokenizer, settings):
    settings.GYRE_DATA_ROOTS = [tokenizer[1]]  # the operator lets runs read the model's folder
    exp = services.create_experiment(team=people["team"], name="payloads")
    config = {"backend": "real", "steps": 2, "model": {"checkpoint": str(tokenizer[1])}}
    return services.create_run(experiment=exp, config=config, launch=False)


def _ids(tok, text: str) -> np.ndarray:
    return np.asarray(tok.encode(text).ids, dtype=np.int64)


def _rollout(rid: str, group: str, prompt, completion, version: int, progress: float):
    n = len(completion)
    logprobs = -np.linspace(0.1, 2.0, n) - 0.01 * int(rid[1:])  # distinct per rollout
    call = Call(f"{rid}-c0", prompt, completion, logprobs, np.full(n, version, dtype=np.int64))
    return CoreRollout(rid, "task-0", "completed", progress, [call], group)


def _step_events(rollouts, step: int, path: Path) -> list[ev.Event]:
    out: list[ev.Event] = []
    for r in rollouts:
        out.append(ev.RolloutStarted(t=0.0, rollout_id=r.rollout_id, task_id=r.task_id,
                                     group_id=r.group_id, step=step - 1))  # fmt: skip
        out.append(ev.RolloutFinished(t=1.0, rollout_id=r.rollout_id, status="completed",
                                      progress=r.progress, reward=r.progress, turns=1,
                                      tokens=len(r.calls[0].completion_ids),
                                      versions=(step - 1, step - 1)))  # fmt: skip
    groups = list(dict.fromkeys(r.group_id for r in rollouts))
    for g in groups:
        out.append(ev.TreeReady(t=2.0, group_id=g, rollouts=1, tokens_unique=1,
                                tokens_per_call=1, nodes=1))  # fmt: skip
    out.append(ev.RolloutsWritten(t=2.0, step=step, path=str(path), rollouts=len(rollouts),
                                  groups=groups))  # fmt: skip
    return out


def _deliver(run_id: int, events: list[ev.Event]) -> None:
    sink = DbSink(run_id)
    for e in events:
        sink.emit(e)
    sink.flush()


def test_rollouts_written_imports_the_payload_once_and_serves_tokens(
    run, people, client_for, tokenizer, tmp_path
):
    tok, _ = tokenizer
    prompt = _ids(tok, "def main():\n    return fix(bug)\n")
    r0 = _rollout("r0", "g0", prompt, _ids(tok, "assert tests pass\n"), 0, 1.0)
    r1 = _rollout("r1", "g0", prompt, _ids(tok, "run the tool: pytest -q\n"), 0, 0.0)
    r2 = _rollout("r2", "g1", prompt, _ids(tok, "pytest -q\n"), 0, 0.5)
    workdir = tmp_path / "work" / "rollouts"
    workdir.mkdir(parents=True)
    step1 = workdir / "step-00001.jsonl"
    write_rollouts(step1, [r0, r1, r2])
    events = _step_events([r0, r1, r2], 1, step1)
    _deliver(run.pk, events)

    assert Rollout.objects.filter(run=run).count() == 3  # merged with the events' rows
    stored = {
        Path(p) for p in Rollout.objects.filter(run=run).values_list("payload_path", flat=True)
    }
    (copy,) = stored
    assert copy.parent == Path(settings.GYRE_DATA_DIR) / "payloads" / str(run.pk)
    assert copy.read_bytes() == step1.read_bytes()
    tree = Tree.objects.get(run=run, group_id="g0")
    assert (tree.rollouts, tree.nodes, tree.payload_path) == (2, 3, str(copy))
    assert TreeNode.objects.filter(tree=tree).count() == 3
    assert tree.tokens_unique == len(prompt) + len(r0.calls[0].completion_ids) + len(
        r1.calls[0].completion_ids
    )
    before = sorted(TreeNode.objects.filter(tree=tree).values_list("pk", flat=True))

    # Redelivered: same rows, nothing rebuilt.
    _deliver(run.pk, events)
    assert (
        Rollout.objects.filter(run=run).count() == 3 and Tree.objects.filter(run=run).count() == 2
    )
    assert sorted(TreeNode.objects.filter(tree=tree).values_list("pk", flat=True)) == before
    tree.refresh_from_db()
    assert (tree.rollouts, tree.nodes) == (2, 3)  # the stored nodes' counts

    # The work folder goes away; the platform's copy still answers.
    step1.unlink()
    member = client_for(people["member"])
    root = TreeNode.objects.get(tree=tree, depth=0)
    body = member.get(f"/api/trees/{tree.pk}/nodes/{root.pk}/tokens/").json()
    assert body["payload"] and body["decoded"]
    assert body["ids"] == prompt.tolist() and not any(body["generated"])
    assert body["logprobs"] == [None] * len(prompt) and body["advantage"] is None
    assert body["text"] == tok.decode(prompt.tolist(), skip_special_tokens=False)
    assert "".join(body["pieces"]).replace(" ", "") == body["text"].replace(" ", "")
    leaves = {}
    for node in TreeNode.objects.filter(tree=tree, depth=1):
        got = member.get(f"/api/trees/{tree.pk}/nodes/{node.pk}/tokens/").json()
        leaves[tuple(got["ids"])] = (node, got)
    for r, adv in ((r0, 0.5), (r1, -0.5)):
        call = r.calls[0]
        node, got = leaves[tuple(call.completion_ids.tolist())]
        assert all(got["generated"]) and node.trainable == len(call.completion_ids)
        assert got["logprobs"] == [round(float(x), 6) for x in call.logprobs]
        assert got["versions"] == [0] * len(call.completion_ids)
        assert got["advantages"] == [adv] * len(call.completion_ids)
        assert got["advantage"] == adv == node.advantage


def test_a_group_spanning_two_steps_has_a_tree_per_step_part(
    run, people, client_for, tokenizer, tmp_path
):
    tok, _ = tokenizer
    prompt = _ids(tok, "run the tool: pytest -q\n")
    r0 = _rollout("r0", "g0", prompt, _ids(tok, "assert tests pass\n"), 0, 1.0)
    r1 = _rollout("r1", "g0", prompt, _ids(tok, "def main():\n"), 1, 0.0)
    r2 = _rollout("r2", "g0", prompt, _ids(tok, "pytest -q\n"), 1, 0.5)
    one, two = tmp_path / "step-00001.jsonl", tmp_path / "step-00002.jsonl"
    write_rollouts(one, [r0])
    write_rollouts(two, [r1, r2])
    _deliver(run.pk, _step_events([r0], 1, one))
    first = Tree.objects.get(run=run, group_id="g0", step=1)
    assert (first.rollouts, first.nodes) == (1, 1)
    _deliver(run.pk, _step_events([r1, r2], 2, two))
    _deliver(run.pk, _step_events([r1, r2], 2, two))  # redelivered: nothing rebuilt
    second = Tree.objects.get(run=run, group_id="g0", step=2)
    assert Tree.objects.filter(run=run).count() == 2
    assert (second.rollouts, second.nodes) == (2, 3)
    first.refresh_from_db()
    assert (first.rollouts, first.nodes) == (1, 1)  # the first part's tree stands
    paths = dict(Rollout.objects.filter(run=run).values_list("rollout_id", "payload_path"))
    assert paths["r0"] == first.payload_path and paths["r1"] == paths["r2"] == second.payload_path
    assert all(Path(p).is_file() for p in paths.values())
    viewer = client_for(people["viewer"])
    listed = viewer.get(f"/api/trees/?run={run.pk}&step=2").json()["results"]
    assert [(t["group_id"], t["step"]) for t in listed] == [("g0", 2)]
    leaf = TreeNode.objects.get(tree=second, depth=1, advantage__lt=0)
    got = viewer.get(f"/api/trees/{second.pk}/nodes/{leaf.pk}/tokens/").json()
    assert got["ids"] == r1.calls[0].completion_ids.tolist() and got["versions"][0] == 1
    assert got["advantage"] == -0.25  # rewards 0 and 0.5 in its step (r0 is in another)


def test_a_step_trained_again_after_a_resume_replaces_that_steps_trees(run, tokenizer, tmp_path):
    tok, _ = tokenizer
    prompt = _ids(tok, "run the tool: pytest -q\n")
    r0 = _rollout("r0", "g0", prompt, _ids(tok, "assert tests pass\n"), 0, 1.0)
    r1 = _rollout("r1", "g0", prompt, _ids(tok, "def main():\n"), 0, 0.0)
    path = tmp_path / "step-00001.jsonl"
    write_rollouts(path, [r0])
    _deliver(run.pk, _step_events([r0], 1, path))
    write_rollouts(path, [r0, r1])  # the same step, trained again on another batch
    _deliver(run.pk, _step_events([r0, r1], 1, path))
    tree = Tree.objects.get(run=run, group_id="g0", step=1)
    assert (tree.rollouts, tree.nodes) == (2, 3)
    assert TreeNode.objects.filter(tree=tree).count() == 3


def test_tokens_endpoint_permissions_and_a_tree_without_payload(run, people, client_for):
    from gyre_web.trajectories.services import create_tree

    tree = create_tree(run_id=run.pk, group_id="bare", nodes=[{"id": 0, "parent": None}])
    node = tree.tree_nodes.get()
    url = f"/api/trees/{tree.pk}/nodes/{node.pk}/tokens/"
    body = client_for(people["viewer"]).get(url).json()
    assert body["payload"] is False and body["ids"] == []
    assert client_for(people["outsider"]).get(url).status_code == 404
    assert client_for().get(url).status_code in (401, 403)
    _, key = teams.create_share_link(created_by=people["owner"], run=run)
    assert client_for().get(url, HTTP_X_GYRE_SHARE=key).status_code == 200
    other = f"/api/trees/{tree.pk}/nodes/{node.pk + 10_000}/tokens/"
    assert client_for(people["member"]).get(other).status_code == 404


def test_a_token_that_decodes_to_nul_is_stored_visibly(run, tokenizer, tmp_path):
    # Byte-level BPE has a token per byte, NUL included: a sampled completion can hold it,
    # and PostgreSQL's text and jsonb columns refuse the character it decodes to.
    tok, _ = tokenizer
    nul = next(i for i in range(tok.get_vocab_size()) if tok.decode([i]) == "\x00")
    completion = np.concatenate([_ids(tok, "assert"), [nul], _ids(tok, " tests pass\n")])
    r0 = _rollout("r0", "g0", _ids(tok, "def main():\n"), completion.astype(np.int64), 0, 1.0)
    path = tmp_path / "step-00001.jsonl"
    write_rollouts(path, [r0])
    events = _step_events([r0], 1, path)
    events.append(ev.RunStatus(t=3.0, status="running", step=1, message="a\x00b \ud800"))
    events.append(ev.RolloutStarted(t=3.0, rollout_id="r9", task_id="t\x00", group_id="g", step=1))
    _deliver(run.pk, events)  # on PostgreSQL: would raise DataError if a NUL reached it

    (node,) = TreeNode.objects.filter(tree__run=run)  # one rollout: one segment
    head = [*r0.calls[0].prompt_ids.tolist(), *completion.tolist()][:24]  # PREVIEW_TOKENS
    assert node.preview == tok.decode(head).replace("\x00", "\u2400")
    assert "\u2400" in node.preview and "\x00" not in node.preview
    (status,) = RunEvent.objects.filter(run=run, kind="run_status")
    assert status.data["message"] == "a\u2400b \ufffd"
    assert Rollout.objects.get(run=run, rollout_id="r9").task_id == "t\u2400"


def test_a_nan_metric_is_stored_as_null_and_makes_no_point(run):
    # A diverging loss is NaN; JSON has no NaN and PostgreSQL's jsonb refuses the token.
    metrics = {"loss": float("nan"), "reward": 0.25}
    _deliver(run.pk, [ev.StepFinished(t=1.0, step=1, version=1, metrics=metrics)])
    (row,) = RunEvent.objects.filter(run=run, kind="step_finished")
    assert row.data["metrics"] == {"loss": None, "reward": 0.25}
    stored = set(MetricPoint.objects.filter(run=run).values_list("name", "value"))
    assert stored == {("reward", 0.25)}
