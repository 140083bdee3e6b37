"""A run's task indices (``task_index``: training tasks, benchmark tasks, warm-start demos)
are tasks of every suite, however many a run draws: the repo suite makes one per index, and
the coding suite's four tasks wrap around."""

from __future__ import annotations

import pytest

from gyre_core.config import RunConfig
from gyre_core.envs import coding
from gyre_core.rollout.task_env import CodingTaskEnv, RepoTaskEnv, make_env
from gyre_core.runtime.session import task_index

DRAWN = [*range(200), *range(10_000, 10_050)]  # training and benchmark k, warm-start demos


def test_a_coding_run_draws_valid_tasks_for_many_tasks_and_every_task_in_turn():
    cfg = RunConfig.from_dict({"rollout": {"suite": "coding"}})
    seen = []
    for split in ("train", "benchmark"):
        for k in DRAWN:
            env = make_env("coding", split, task_index(cfg, k), k, suite_seed=cfg.seed)
            assert isinstance(env, CodingTaskEnv)
            seen.append(env.task_id)
    assert set(seen) == {f"coding-{name}" for name in coding.TASKS}
    first = seen[: len(coding.TASKS)]  # consecutive draws go round the whole pool
    assert len(set(first)) == len(coding.TASKS)


@pytest.mark.parametrize("size", ["short", "medium", "long"])
def test_a_repo_run_keeps_its_configured_size(size):
    cfg = RunConfig.from_dict({"rollout": {"suite": "repo", "size": size}})
    for k in (0, 1, 7, 10_003):
        env = make_env("repo", "train", task_index(cfg, k), k, suite_seed=cfg.seed)
        assert isinstance(env, RepoTaskEnv) and env.task_id.startswith(f"train-{size}-")


def test_the_coding_pool_wraps_and_a_negative_index_is_refused():
    names = sorted(coding.TASKS)
    n = len(names)
    assert make_env("coding", "train", n).task_id == make_env("coding", "train", 0).task_id
    assert make_env("coding", "train", 2 * n + 1).task_id == make_env("coding", "train", 1).task_id
    with pytest.raises(ValueError, match="coding suite index must be an integer >= 0"):
        make_env("coding", "train", -1)
