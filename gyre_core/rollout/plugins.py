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
        def tasks(cls, split: str) -> Sequence[dict]: ...  # its own tasks (train, heldout, benchmark)
        task_id, workdir, multiline_actions, last_failed, last_error, tool_latency_s
        credit(), components(), component_done(i), oracle_actions(i), finish_action(),
        snapshot(), restore(snap), close()              # as TaskEnv's (docs/agents.md)

The built-in harness steps it with the model's actions (one line each unless
``multiline_actions``); an external agent (``rollout.agent``) gets its prompt and ``workdir``,
and ``progress()`` scores the rollout. Each optional member it lacks has a neutral default
(:class:`PluginEnv`): one component, no save points (so no retries), no oracle.
An exception from the plugin (outside its grading) fails that rollout alone (status
``failed``, ``failure: environment``, the error in ``extra.env_error``), with what was
played until then; such a rollout is kept out of its group's statistics and not trained.

**Tasks** come from ``rollout.tasks``, a JSONL file (one JSON object a line) or a Parquet
file (one row a task), or, when that is empty, from the plugin's own ``tasks(split)``. A
task's split is its ``rollout.task_split_field`` value (``train`` when absent); ``id`` names
it (default ``<split>-<position>``). The run's ``k``-th task of a split is its ``k``-th task
there, wrapping round.

**A reward function** ``"package.module:function"`` is called with the finished
:class:`~gyre_core.trajectory.format.Rollout` and its environment and returns the reward
(a finite number); without one the reward is ``rollout.reward`` on the environment
(:func:`~gyre_core.rollout.evaluation.settle_reward`). Grading a rollout (its ``progress()``, ``credit()`` and the reward
function) is its *evaluation*: one that raises is retried up to ``rollout.eval_retries``
times, and when none succeeds the rollout fails (``failure: evaluation``, ``extra.reward_error``)
and is dropped from training.

The built-in suites (``rollout.suite``: ``repo``, ``coding``) are two such classes
(:mod:`~gyre_core.rollout.suites`), run through the same code (:func:`run_suite`).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from gyre_core.envs import repo_suite
from gyre_core.jsonl import LocatedError, json_lines
from gyre_core.rollout import suites
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.task_env import Component, TaskEnv

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
    """A plugin's environment as the harness drives it (:class:`TaskEnv`): its reset, step and
    progress, and each optional member it has (sub-goals, save points, an oracle, tool
    latency, failures, finer credit); what it lacks has a neutral default: one component,
    no save points (so no retries), no oracle. An exception from the plugin ends the episode
    and is kept in ``error``. ``task_id``: the plugin's own ``task_id`` where it has one."""

    def __init__(self, env: EnvPlugin, task_id: str) -> None:
        self.env = env
        own = getattr(env, "task_id", None)
        self.task_id = own if isinstance(own, str) and own else task_id
        self.multiline_actions = bool(getattr(env, "multiline_actions", False))
        self.error: str | None = None  # what the plugin raised in play (not in grading)
        self.eval_error: str | None = None  # what its progress or credit last raised
        self._done = False
        w = getattr(env, "workdir", None)
        self.workdir = Path(w) if w else None

    def _fail(self, what: str, e: Exception) -> None:
        self.error = f"{what} raised {type(e).__name__}: {e}"

    def _optional(self, name: str, default: Any, *args: Any) -> Any:
        """The plugin's member ``name`` (called with ``args`` when a method), or ``default``
        where it has none or it raised (kept in ``error``)."""
        if self.error is not None:
            return default
        try:
            got = getattr(self.env, name, None)
            if got is None:
                return default
            return got(*args) if callable(got) else got
        except Exception as e:
            self._fail(name, e)
            return default

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
        """The plugin's progress, 0 where it raised: grading a rollout is its evaluation
        (``rollout/evaluation.py``, retried), so a failure here does not end the episode."""
        try:
            return self.graded()
        except Exception as e:
            self.eval_error = f"progress raised {type(e).__name__}: {e}"
            return 0.0

    def credit(self) -> float:
        """The plugin's finer partial credit (``credit()``, for ``rollout.reward: partial``),
        else its progress (its progress where it raised)."""
        try:
            return self.graded("credit")
        except Exception as e:
            self.eval_error = f"credit raised {type(e).__name__}: {e}"
            return self.progress()

    def graded(self, member: str = "progress") -> float:
        """``progress()`` (or ``credit()``, when the plugin has one) into [0, 1], raising
        what the plugin raised: one try of the rollout's evaluation."""
        got = getattr(self.env, member, None) if member == "credit" else None
        p = float(got() if callable(got) else self.env.progress())
        if not math.isfinite(p):
            raise ValueError(f"{member} returned {p}")
        return min(1.0, max(0.0, p))

    @property
    def tool_latency_s(self) -> float:
        return float(self._optional("tool_latency_s", 0.0))

    @property
    def last_failed(self) -> bool:
        return bool(self._optional("last_failed", False))

    @property
    def last_error(self) -> bool:
        return bool(self._optional("last_error", False))

    def components(self) -> list[Component]:
        return list(self._optional("components", None) or [Component("task", "do the task")])

    def component_done(self, index: int) -> bool:
        if getattr(self.env, "component_done", None) is None:
            return self._done and self.progress() >= 1.0
        return bool(self._optional("component_done", False, index))

    def oracle_actions(self, index: int) -> list[str]:
        oracle = getattr(self.env, "oracle_actions", None)
        if oracle is None:
            raise ValueError(
                "this environment has no oracle_actions (a scripted warm start replays them)"
            )
        return list(oracle(index))

    def finish_action(self) -> str | None:
        got = self._optional("finish_action", None)
        return None if got is None else str(got)

    def snapshot(self) -> Any:
        return self._optional("snapshot", None)

    def restore(self, snap: Any) -> None:
        if snap is not None:
            self._optional("restore", None, snap)

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


class PluginSuite:
    """An environment class over its task list, by split (``rollout.env`` or a built-in
    suite, :mod:`~gyre_core.rollout.suites`)."""

    def __init__(self, cls: Callable[..., EnvPlugin], tasks: dict[str, Sequence[Any]]) -> None:
        self.cls, self.tasks = cls, tasks

    def env(self, split: str, k: int, seed: int) -> TaskEnv:
        pool = self.tasks.get(split) or []
        if not len(pool):
            raise PluginError("rollout.tasks", f"no {split} tasks")
        task = pool[k % len(pool)]
        if not isinstance(task, dict):
            raise PluginError("rollout.env", f"task {k % len(pool)} of {split} is not a dict")
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


def run_suite(r: RolloutConfig, seed: int) -> PluginSuite:
    """A run's tasks: the environment class (``rollout.env``, else the built-in suite
    ``rollout.suite`` as a plugin class) over its task list (``rollout.tasks``, else the
    class's own ``tasks(split)``)."""
    if r.env:
        cls, name = load_callable(r.env, "rollout.env"), r.env
    else:
        cls = suites.builtin(r.suite, size=r.size, hints=r.hints == "status", suite_seed=seed)
        name = f"{cls.__module__}:{cls.__qualname__}"
    if r.tasks:
        return PluginSuite(cls, dict(read_tasks(Path(r.tasks), r.task_split_field)))
    own = getattr(cls, "tasks", None)
    if not callable(own):
        raise PluginError("rollout.tasks", f"{name} has no tasks(split): name a task file")
    tasks: dict[str, Sequence[Any]] = {}
    for split in SPLITS:
        try:
            got = own(split)
            if not isinstance(got, Sequence):  # a generator, a set: read once
                got = list(got)
        except Exception as e:
            raise PluginError(
                "rollout.env", f"{name}.tasks({split!r}) raised {type(e).__name__}: {e}"
            ) from None
        if not all(isinstance(t, dict) for t in got[:1000]):  # an endless list: its head
            raise PluginError("rollout.env", f"{name}.tasks({split!r}) must return dicts")
        tasks[split] = got
    if not len(tasks["train"]):
        raise PluginError("rollout.env", f"{name}.tasks('train') is empty")
    return PluginSuite(cls, tasks)


__all__ = [
    "PluginEnv",
    "PluginError",
    "PluginSuite",
    "Suite",
    "load_callable",
    "read_tasks",
    "run_suite",
]
