"""A run's tasks (the built-in suites are plugin classes over their own task lists): the
``k``-th task of a split, for training, benchmark and warm-start draws, is a task of every
suite however many a run draws: the repo suite makes one per index, and the coding suite's
four tasks wrap around."""

from __future__ import annotations

import pytest

from gyre_core.config import RunConfig
from gyre_core.envs import coding
from gyre_core.rollout.plugins import PluginEnv
from gyre_core.rollout.suites import CodingSuite, RepoSuite
from gyre_core.rollout.task_env import make_env
from gyre_core.runtime.session import make_suite

DRAWN = [*range(200), *range(10_000, 10_050)]  # training and benchmark k, warm-start demos


def test_a_coding_run_draws_valid_tasks_for_many_tasks_and_every_task_in_turn():
    suite = make_suite(RunConfig.from_dict({"rollout": {"suite": "coding"}}))
    seen = []
    for split in ("train", "benchmark"):
        for k in DRAWN:
            env = suite.env(split, k, k)
            assert isinstance(env, PluginEnv) and isinstance(env.env, CodingSuite)
            seen.append(env.task_id)
            env.close()
    assert set(seen) == {f"coding-{name}" for name in coding.TASKS}
    first = seen[: len(coding.TASKS)]  # consecutive draws go round the whole pool
    assert len(set(first)) == len(coding.TASKS)


@pytest.mark.parametrize("size", ["short", "medium", "long"])
def test_a_repo_run_keeps_its_configured_size(size):
    suite = make_suite(RunConfig.from_dict({"rollout": {"suite": "repo", "size": size}}))
    for k in (0, 1, 7, 10_003):
        env = suite.env("train", k, k)
        assert isinstance(env.env, RepoSuite) and env.task_id.startswith(f"train-{size}-")


def test_the_suites_draw_the_tasks_make_env_names():
    """The plugin classes give the tasks the harness's own factory gives for the same index
    (``make_env``, which the CLI's named tasks use): the same prompts, the same task ids."""
    cfg = RunConfig.from_dict({"seed": 3, "rollout": {"suite": "repo", "size": "medium"}})
    suite = make_suite(cfg)
    for k in (0, 5):
        ours, theirs = (
            suite.env("heldout", k, 11),
            make_env("repo", "heldout", 3 * k + 1, 11, suite_seed=3),
        )
        assert ours.task_id == theirs.task_id and ours.reset() == theirs.reset()


def test_the_coding_pool_wraps_and_a_negative_index_is_refused():
    names = sorted(coding.TASKS)
    n = len(names)
    assert make_env("coding", "train", n).task_id == make_env("coding", "train", 0).task_id
    assert make_env("coding", "train", 2 * n + 1).task_id == make_env("coding", "train", 1).task_id
    with pytest.raises(ValueError, match="coding suite index must be an integer >= 0"):
        make_env("coding", "train", -1)
