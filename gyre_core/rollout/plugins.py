"""Plugins by import path: a run's environment (``rollout.env``), its task list
(``rollout.tasks``) and its reward (``rollout.reward_fn``).

**An environment plugin** is a class named ``"package.module:Class"``. One instance plays one
rollout of one task::

    class MyEnv:
        def __init__(self, task: dict, seed: int) -> None: ...   # one task, one episode
        def reset(self) -> str: ...                     # the task prompt
        def step(self, action: str) -> tuple[str, bool]: ...    # observation, done
        def progress(self) -> float: ...                # share of the task done, in [0, 1]
        # optional:
        @classmethod
        def tasks(cls, split: str) -> list[dict]: ...   # its own task list (train, heldout, benchmark)
        workdir: str                                    # a folder an external agent works in
        multiline_actions: bool                         # an action may span lines (default False)
        def close(self) -> None: ...

The built-in harness steps it with the model's actions (one line each unless
``multiline_actions``); an external agent (``rollout.agent``) gets its prompt and ``workdir``,
and ``progress()`` scores the rollout. What the harness needs beyond that (sub-goals, save
points, an oracle) has neutral defaults (:class:`PluginEnv`): one component, no retries.
An exception from the plugin fails that rollout alone (status ``failed``, the error in
``extra.env_error``), with what was played until then.

**Tasks** come from ``rollout.tasks``, a JSONL file (one JSON object a line) or a Parquet
file (one row a task), or, when that is empty, from the plugin's own ``tasks(split)``. A
task's split is its ``rollout.task_split_field`` value (``train`` when absent); ``id`` names
it (default ``<split>-<position>``). The run's ``k``-th task of a split is its ``k``-th task
there, wrapping round.

**A reward function** ``"package.module:function"`` is called with the finished
:class:`~gyre_core.trajectory.format.Rollout` and its environment and returns the reward
(a finite number); without one the reward is ``rollout.reward`` on the environment's
progress. One that raises fails its rollout alone (reward 0, ``extra.reward_error``).

The built-in suites (``rollout.suite``: ``repo``, ``coding``) are suites like any other
(:class:`BuiltinSuite`): the run asks every suite for the ``k``-th task of a split the same way.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gyre_core.envs import repo_suite
from gyre_core.jsonl import LocatedError, json_lines
from gyre_core.rollout.task_env import Component, TaskEnv, make_env

SPLITS = repo_suite.SPLITS


class TaskFileError(LocatedError):
    """A task file's bad line (re-raised as a :class:`PluginError`)."""


class PluginError(ValueError):
    """A plugin or task file that cannot be used; ``field`` names the config field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def load_callable(path: str, field: str) -> Callable[..., Any]:
    """``"package.module:name"`` imported (installed, or importable from the directory the
    run started in), or a :class:`PluginError` naming ``field``."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise PluginError(field, f"expected 'package.module:name', got {path!r}")
    here = os.getcwd()  # a module beside the run imports, as with `python -m`
    if here not in sys.path:
        sys.path.append(here)
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # an import runs the user's code: anything can go wrong
        raise PluginError(field, f"cannot import {module!r}: {type(e).__name__}: {e}") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise PluginError(field, f"{module!r} has no attribute {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise PluginError(field, f"{path!r} is not callable")
    return obj  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- tasks


def read_tasks(path: Path, split_field: str = "split") -> dict[str, list[dict[str, Any]]]:
    """A task file by split; a bad line or row is a :class:`PluginError` naming
    ``rollout.tasks``, the file and the line."""
    rows: list[tuple[str, Any]] = []
    if not path.is_file():
        raise PluginError("rollout.tasks", f"{path}: no such file")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise PluginError(
                "rollout.tasks", "reading Parquet needs pyarrow (pip install pyarrow)"
            ) from None
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow's errors have no common base
            raise PluginError("rollout.tasks", f"{path}: not a Parquet file ({e})") from None
        rows = [(f"{path}: row {i + 1}", r) for i, r in enumerate(table.to_pylist())]
    else:
        try:
            rows = [(f"{path}:{n}", obj) for n, obj in json_lines(path, TaskFileError)]
        except TaskFileError as e:
            raise PluginError("rollout.tasks", f"{e.file}:{e.line}: {e.problem}") from None
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for where, row in rows:
        if not isinstance(row, dict):
            raise PluginError(
                "rollout.tasks", f"{where}: expected a JSON object, got {type(row).__name__}"
            )
        split = row.get(split_field) or "train"  # absent or null (a Parquet column's gap)
        if split not in out:
            raise PluginError(
                "rollout.tasks",
                f"{where}: {split_field} {split!r} is not one of {', '.join(SPLITS)}",
            )
        out[split].append(row)
    if not out["train"]:
        raise PluginError("rollout.tasks", f"{path}: no train tasks")
    return out


# --------------------------------------------------------------------------- environments


class EnvPlugin(Protocol):
    def reset(self) -> str: ...

    def step(self, action: str) -> tuple[str, bool]: ...

    def progress(self) -> float: ...


class PluginEnv:
    """A plugin's environment as the harness drives it (:class:`TaskEnv`): the plugin's
    reset, step and progress; one component; no save points, so no retries. An exception
    from the plugin ends the episode and is kept in ``error``."""

    def __init__(self, env: EnvPlugin, task_id: str) -> None:
        self.env = env
        self.task_id = task_id
        self.multiline_actions = bool(getattr(env, "multiline_actions", False))
        self.error: str | None = None
        self._done = False
        w = getattr(env, "workdir", None)
        self.workdir = Path(w) if w else None

    def _fail(self, what: str, e: Exception) -> None:
        self.error = f"{what} raised {type(e).__name__}: {e}"

    def reset(self) -> str:
        try:
            return str(self.env.reset())
        except Exception as e:
            self._fail("reset", e)
            self._done = True
            return ""

    def step(self, action: str) -> tuple[str, bool]:
        if self.error is not None:
            return "episode is over", True
        try:
            obs, done = self.env.step(action)
        except Exception as e:
            self._fail("step", e)
            return f"error: the environment failed ({type(e).__name__})", True
        self._done = bool(done)
        return str(obs), self._done

    def progress(self) -> float:
        try:
            p = float(self.env.progress())
        except Exception as e:
            self._fail("progress", e)
            return 0.0
        if not math.isfinite(p):
            self.error = f"progress returned {p}"
            return 0.0
        return min(1.0, max(0.0, p))

    @property
    def tool_latency_s(self) -> float:
        return 0.0

    @property
    def last_failed(self) -> bool:
        return False

    @property
    def last_error(self) -> bool:
        return False

    def components(self) -> list[Component]:
        return [Component("task", "do the task")]

    def component_done(self, index: int) -> bool:
        return self._done and self.progress() >= 1.0

    def oracle_actions(self, index: int) -> list[str]:
        raise ValueError(
            "a plugin environment has no oracle (a scripted warm start needs a built-in suite)"
        )

    def finish_action(self) -> str | None:
        return None

    def snapshot(self) -> Any:
        return None

    def restore(self, snap: Any) -> None:
        pass

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as e:
                self._fail("close", e)


# --------------------------------------------------------------------------- suites


class Suite(Protocol):
    def env(self, split: str, k: int, seed: int) -> TaskEnv:
        """The ``k``-th task of ``split``, for an episode seeded ``seed``."""


class BuiltinSuite:
    """``rollout.suite``: the repo-building suite or the coding suite."""

    def __init__(
        self, name: str, index: Callable[[int], int], suite_seed: int, hints: bool
    ) -> None:
        self.name, self.index = name, index  # index: the suite's task index of the k-th task
        self.suite_seed, self.hints = suite_seed, hints

    def env(self, split: str, k: int, seed: int) -> TaskEnv:
        return make_env(
            self.name, split, self.index(k), seed, suite_seed=self.suite_seed, hints=self.hints
        )


class PluginSuite:
    """``rollout.env``: a plugin class over its task list."""

    def __init__(
        self, cls: Callable[..., EnvPlugin], tasks: dict[str, list[dict[str, Any]]]
    ) -> None:
        self.cls, self.tasks = cls, tasks

    def env(self, split: str, k: int, seed: int) -> TaskEnv:
        pool = self.tasks.get(split) or []
        if not pool:
            raise PluginError("rollout.tasks", f"no {split} tasks")
        task = pool[k % len(pool)]
        task_id = str(task.get("id", f"{split}-{k % len(pool)}"))
        try:
            env = self.cls(task, seed)
        except Exception as e:
            broken = PluginEnv(_Broken(), task_id)
            broken.error = f"constructing it raised {type(e).__name__}: {e}"
            return broken
        return PluginEnv(env, task_id)


class _Broken:
    def reset(self) -> str:
        return ""

    def step(self, action: str) -> tuple[str, bool]:
        return "episode is over", True

    def progress(self) -> float:
        return 0.0


def plugin_suite(env_path: str, tasks_path: str, split_field: str) -> PluginSuite:
    """``rollout.env`` with its tasks (``rollout.tasks``, else the class's ``tasks(split)``)."""
    cls = load_callable(env_path, "rollout.env")
    if tasks_path:
        tasks = read_tasks(Path(tasks_path), split_field)
    else:
        own = getattr(cls, "tasks", None)
        if not callable(own):
            raise PluginError("rollout.tasks", f"{env_path} has no tasks(split): name a task file")
        tasks = {}
        for split in SPLITS:
            try:
                got = list(own(split))
            except Exception as e:
                raise PluginError(
                    "rollout.env", f"{env_path}.tasks({split!r}) raised {type(e).__name__}: {e}"
                ) from None
            if not all(isinstance(t, dict) for t in got):
                raise PluginError("rollout.env", f"{env_path}.tasks({split!r}) must return dicts")
            tasks[split] = got
        if not tasks["train"]:
            raise PluginError("rollout.env", f"{env_path}.tasks('train') is empty")
    return PluginSuite(cls, tasks)


def reward_of(fn: Callable[..., Any], rollout: Any, env: TaskEnv) -> tuple[float, str | None]:
    """``fn(rollout, env)`` as a reward, or 0 and why it could not be one."""
    try:
        r = float(fn(rollout, env))
    except Exception as e:
        return 0.0, f"{type(e).__name__}: {e}"
    if not math.isfinite(r):
        return 0.0, f"returned {r}"
    return r, None


__all__ = [
    "BuiltinSuite",
    "PluginEnv",
    "PluginError",
    "PluginSuite",
    "Suite",
    "load_callable",
    "plugin_suite",
    "read_tasks",
    "reward_of",
]
