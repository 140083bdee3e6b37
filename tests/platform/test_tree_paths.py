"""The tree browser shows which paths a step trained: for a run with ``train.max_paths``,
each stored node carries the generated tokens the step's trainer took (the same seeded
draw: the run's seed, the version the step trained), untaken subtrees show 0; a run that
trains every path shows none (null)."""

from __future__ import annotations

import numpy as np
import pytest
from gyre_web.runs import services
from gyre_web.trajectories.models import Tree, TreeNode

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.runtime.plan import train_setup
from gyre_core.train.trainer import BatchPlan
from gyre_core.trajectory.format import Call, Prefix
from gyre_core.trajectory.format import Rollout as CoreRollout
from gyre_core.trajectory.writer import write_rollouts
from workers.sink import DbSink

PROMPT = [1, 2, 3, 4, 5]


def _call(cid: str, prompt: list[int], completion: list[int], prefix=None) -> Call:
    n = len(completion)
    return Call(
        cid,
        np.asarray(prompt, dtype=np.int64),
        np.asarray(completion, dtype=np.int64),
        np.full(n, -0.5),
        np.zeros(n, dtype=np.int64),
        kind="retry" if prefix else "continue",
        prefix=prefix,
    )


def _rollout(rid: str, base: int, progress: float) -> CoreRollout:
    """Three main branches under the prompt: 2, 3 and 4 generated tokens."""
    calls = [
        _call(f"{rid}a", PROMPT, [base, base + 1]),
        _call(f"{rid}b", [], [base + 10, base + 11, base + 12], Prefix(f"{rid}a", 5)),
        _call(f"{rid}c", [], [base + 20, base + 21, base + 22, base + 23], Prefix(f"{rid}a", 5)),
    ]
    return CoreRollout(rid, "task-0", "completed", progress, calls, "g0")


BATCH = [_rollout("r0", 100, 1.0), _rollout("r1", 200, 0.0)]


def _stored(people, train: dict, step: int, tmp_path) -> tuple[dict, RunConfig, Tree]:
    exp = services.create_experiment(team=people["team"], name=f"paths {sorted(train.items())}")
    run = services.create_run(
        experiment=exp, config={"backend": "real", "seed": 17, "train": train}, launch=False
    )
    path = tmp_path / f"run{run.pk}-step-{step:05d}.jsonl"
    write_rollouts(path, BATCH)
    sink = DbSink(run.pk)
    sink.emit(ev.RolloutsWritten(t=1.0, step=step, path=str(path), rollouts=2, groups=["g0"]))
    sink.flush()
    tree = Tree.objects.get(run=run, group_id="g0", step=step)
    rows = {(n.token_start, n.token_end, n.preview): n for n in TreeNode.objects.filter(tree=tree)}
    return rows, RunConfig.from_dict(run.config), tree


@pytest.mark.django_db
def test_a_path_sampled_run_shows_the_paths_its_step_trained(people, client_for, tmp_path):
    rows, cfg, tree = _stored(people, {"max_paths": 1}, step=3, tmp_path=tmp_path)
    setup = train_setup(cfg)
    plan = BatchPlan(setup.train, setup.staleness_bound, setup.seed)
    trees = plan.weigh(BATCH, current_version=2)  # step 3 trains version 2's rollouts
    trained = {
        (int(n.tokens[0]), n.start): int((n.generated & n.taken).sum()) for n in trees["g0"].nodes()
    }
    shown = {}
    for row in rows.values():
        first = int(row.preview.strip("[]").split()[0])
        shown[(first, row.token_start)] = row.taken
    # the trainer's pruned tree: the prompt and one branch per rollout, as the rows mark them
    assert sum(1 for t in trained.values() if t) == 2
    for key, taken in shown.items():
        assert taken == trained.get(key, 0), key
    assert sum(1 for t in shown.values() if t == 0) == 5  # the prompt, four untaken branches
    assert sum(shown.values()) == sum(trained.values()) > 0
    member = client_for(people["member"])
    (root,) = member.get(f"/api/trees/{tree.pk}/nodes/").json()["results"]
    assert root["taken"] == 0  # the prompt: context, nothing generated
    kids = member.get(f"/api/trees/{tree.pk}/nodes/?parent={root['id']}").json()["results"]
    assert sorted(k["taken"] for k in kids) == sorted(
        shown[(int(k["preview"].strip("[]").split()[0]), k["token_start"])] for k in kids
    )
    assert len(kids) == 6 and sum(1 for k in kids if k["taken"]) == 2


@pytest.mark.django_db
def test_a_run_training_every_path_marks_nothing(people, tmp_path):
    rows, _, _ = _stored(people, {}, step=1, tmp_path=tmp_path)
    assert rows and all(r.taken is None for r in rows.values())
