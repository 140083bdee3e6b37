"""Plugins by import path: an environment class, its tasks from a JSONL or Parquet file (or
its own list), a reward function; sessions of a run play them on a real engine, and a
plugin that raises fails its rollout alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import ListSink
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.evaluation import settle_reward
from gyre_core.rollout.plugins import PluginEnv, PluginError, read_tasks, run_suite
from gyre_core.rollout.router import Router
from gyre_core.rollout.suites import CodingSuite
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.benchmark import benchmark
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.trajectory.failures import left_out
from gyre_core.trajectory.format import Rollout

ENV = "tests.rollout.plugins.word_env:WordEnv"


def suite_of(env: str, tasks: str = ""):  # type: ignore[no-untyped-def]
    return run_suite(RolloutConfig(env=env, tasks=tasks), seed=0)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_task_file_is_read_by_split_in_jsonl_or_parquet(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = [
        {"id": "a", "word": "apple", "part": None},
        {"id": "b", "word": "pear", "part": "heldout"},
        {"id": "c", "word": "fig", "part": "train"},
    ]
    got = read_tasks(write_jsonl(tmp_path / "t.jsonl", rows), "part")
    assert [t["word"] for t in got["train"]] == ["apple", "fig"] and got["heldout"][0][
        "word"
    ] == "pear"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    assert read_tasks(tmp_path / "t.parquet", "part") == got


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"word": "a"}\n{not json\n', "t.jsonl:2: invalid JSON"),
        ('{"word": "a"}\n[1, 2]\n', "t.jsonl:2: expected a JSON object, got list"),
        ('{"word": "a", "split": "test"}\n', "t.jsonl:1: split 'test' is not one of"),
        ('{"word": "a", "split": "heldout"}\n', "no train tasks"),
    ],
)
def test_a_bad_task_file_is_refused_naming_its_line(tmp_path, content: str, problem: str) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "t.jsonl").write_text(content)
    with pytest.raises(PluginError, match=r"rollout\.tasks") as e:
        read_tasks(tmp_path / "t.jsonl")
    assert problem in str(e.value)


def test_plugin_paths_and_fields_are_refused_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PluginError, match=r"rollout\.env: cannot import"):
        suite_of("tests.rollout.plugins.nowhere:Env")
    with pytest.raises(PluginError, match=r"rollout\.tasks: .* no tasks\(split\)"):
        suite_of("json:JSONDecoder")
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"rollout": {"env": "no-colon", "tasks": "t.jsonl", "reward_fn": "x"}})
    assert {f for f, _ in e.value.errors} == {"rollout.env", "rollout.reward_fn"}
    # a scripted warm start replays the environment's oracle: refused at the run's start,
    # by field, for a class without one
    cfg = RunConfig.from_dict({"model": {"layers": 1}, "rollout": {"env": ENV},
                               "warm_start": {"steps": 2}})  # fmt: skip
    model_dir = make_model_dir(cfg, tmp_path)
    with pytest.raises(PluginError, match=r"warm_start\.steps: .*oracle_actions.*WordEnv"):
        SessionFactory(cfg, model_dir, ListSink(), lambda: 0.0)


def test_a_plugin_that_raises_ends_its_episode_and_keeps_why() -> None:
    suite = suite_of(ENV)
    env = suite.env("train", 0, 0)
    assert env.reset() == "Say the word apple." and env.step("apple pie") == ("yes", True)
    assert env.progress() == 1.0 and env.component_done(0)
    crashing = PluginEnv(type("Crash", (), {"reset": lambda s: "go", "step": lambda s, a: 1 / 0,
                                            "progress": lambda s: 7.0})(), "t")  # fmt: skip
    assert crashing.step("x")[1] is True and "ZeroDivisionError" in str(crashing.error)
    assert crashing.progress() == 1.0  # clamped into [0, 1]


def test_run_sessions_play_a_plugin_with_its_task_file_and_reward(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    tasks = write_jsonl(tmp_path / "tasks.jsonl", [
        {"id": "t-apple", "word": "apple"}, {"id": "t-crash", "word": "crash"},
        {"id": "t-boom", "word": "boom"}, {"id": "b-pear", "word": "pear", "split": "benchmark"},
    ])  # fmt: skip
    d = {"model": {"layers": 1}, "rollout": {
        "env": ENV, "tasks": str(tasks), "reward_fn": "tests.rollout.plugins.word_env:reward",
        "tasks_per_step": 3, "group_size": 1, "max_turns": 3, "max_new_tokens": 8, "benchmark_tasks": 1}}  # fmt: skip
    model_dir = make_model_dir(RunConfig.from_dict(d), tmp_path)
    cfg = RunConfig.from_dict({**d, "model": {"checkpoint": str(model_dir)}})
    sink = ListSink()
    factory = SessionFactory(cfg, model_dir, sink, lambda: 0.0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    router = Router({"e": TorchEngine(model)})

    async def play() -> list[Any]:
        return [await factory.session(i, router, None) for i in range(3)]  # type: ignore[arg-type]

    apple, crash, boom = asyncio.run(play())
    assert (apple.task_id, apple.status) == ("t-apple", "completed") and len(apple.calls) == 3
    assert apple.reward == pytest.approx(apple.progress - 0.03)  # the reward function's
    assert (
        crash.status == "failed"
        and "KeyError" in crash.extra["env_error"]
        and len(crash.calls) == 1
    )
    assert boom.status == "failed" and "the task could not start" in boom.extra["env_error"]
    assert (crash.failure, boom.failure, apple.failure) == ("environment", "environment", "")
    score = asyncio.run(benchmark(factory, router, 0))  # the file's benchmark split
    assert 0.0 <= score <= 1.0
    # a reward function that raises fails its rollout alone
    broken = RunConfig.from_dict({**d, "model": {"checkpoint": str(model_dir)},
                                  "rollout": {**d["rollout"], "reward_fn": "tests.rollout.plugins.word_env:broken_reward"}})  # fmt: skip
    r = asyncio.run(SessionFactory(broken, model_dir, sink, lambda: 0.0).session(0, router, None))  # type: ignore[arg-type]
    assert r.status == "failed" and r.reward == 0.0 and "cannot score" in r.extra["reward_error"]
    # ... tried 1 + rollout.eval_retries times, then dropped: an evaluation failure
    assert (r.failure, r.extra["eval_tries"]) == ("evaluation", 3)


class Flaky:
    """A plugin whose grading raises its first ``fails`` times (a test runner that timed
    out, a lost connection to a grading service)."""

    def __init__(self, fails: int) -> None:
        self.fails = fails

    def reset(self) -> str:
        return "go"

    def step(self, action: str) -> tuple[str, bool]:
        return "ok", True

    def progress(self) -> float:
        if self.fails:
            self.fails -= 1
            raise TimeoutError("the grader did not answer")
        return 0.5


def flaky_rollout() -> Rollout:
    return Rollout("r", "t", "completed", 0.0, [], "g")


def test_an_evaluation_that_raises_is_retried_then_the_rollout_dropped() -> None:
    r, env = flaky_rollout(), PluginEnv(Flaky(2), "t")
    settle_reward(r, env, "progress", None, retries=2)  # third try succeeds
    assert (r.status, r.failure, r.progress, r.reward, r.extra["eval_tries"]) == (
        "completed", "", 0.5, 0.5, 3
    )  # fmt: skip
    r, env = flaky_rollout(), PluginEnv(Flaky(3), "t")
    settle_reward(r, env, "partial", None, retries=2)  # every try fails: dropped, not a 0
    assert (r.status, r.failure, r.extra["eval_tries"]) == ("failed", "evaluation", 3)
    assert "TimeoutError: the grader did not answer" in r.extra["reward_error"]
    assert left_out(r) == "dropped_evaluation"
    # grading that raised during play does not end the episode: evaluation is retried after
    env = PluginEnv(Flaky(1), "t")
    assert env.progress() == 0.0 and env.error is None and env.step("x") == ("ok", True)


def test_a_built_in_suite_is_a_plugin_like_any_other(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The coding suite named by import path, over a task file of its own, is driven through
    the same adapter as a user's class: its optional members (oracle, save points, finer
    credit, folder) reach the harness, and its oracle solves the task."""
    tasks = write_jsonl(
        tmp_path / "t.jsonl", [{"name": "rle"}, {"name": "fizzbuzz", "split": "benchmark"}]
    )
    suite = suite_of("gyre_core.rollout.suites:CodingSuite", str(tasks))
    assert suite.cls is CodingSuite
    env = suite.env("benchmark", 7, 0)  # the one benchmark task, wrapping round
    assert env.task_id == "coding-fizzbuzz" and env.workdir is not None and env.workdir.is_dir()
    assert "fizzbuzz" in env.reset()
    save = env.snapshot()
    assert save is not None and env.finish_action() == "submit"  # the suite's, not defaults
    for action in env.oracle_actions(0):
        env.step(action)
    assert env.progress() == 1.0 and env.component_done(0) and env.finish_action() is None
    env.restore(save)
    assert env.progress() < 1.0  # back to the save point
    env.close()


def test_partial_reward_takes_an_environments_credit_where_it_has_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gyre_core.trajectory.format import Rollout

    class Credited:
        def reset(self) -> str:
            return "go"

        def step(self, action: str) -> tuple[str, bool]:
            return "ok", True

        def progress(self) -> float:
            return 0.0

        def credit(self) -> float:
            return 0.4

    plain = suite_of(ENV).env("train", 0, 0)
    for env, want in ((PluginEnv(Credited(), "c"), 0.4), (plain, 0.1)):
        env.reset()
        env.step("nothing")
        r = Rollout("r0", env.task_id, "completed", env.progress(), [], reward=9.0)
        settle_reward(r, env, "partial", None)
        assert r.reward == pytest.approx(want)  # WordEnv has no credit(): its progress
        settle_reward(r, env, "binary", None)
        assert r.reward == 0.0
