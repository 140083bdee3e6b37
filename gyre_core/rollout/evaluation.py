"""A finished rollout's evaluation: its progress and its reward, retried within
``rollout.eval_retries``; an evaluation that never succeeds drops the rollout from training
(``failure: evaluation``, :mod:`gyre_core.trajectory.failures`) instead of scoring it 0."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gyre_core.rollout.plugins import PluginEnv
from gyre_core.rollout.task_env import TaskEnv
from gyre_core.trajectory.format import Rollout


def settle_reward(
    rollout: Rollout, env: TaskEnv, kind: str, fn: Callable[..., Any] | None, *, retries: int = 0
) -> None:
    """A finished rollout's evaluation, the same for every environment: its ``progress``
    (the environment's, as the session left it) and its reward, ``fn(rollout, env)``
    (``rollout.reward_fn``) where given, else ``kind`` (``rollout.reward``) on the
    environment: ``progress``, ``partial`` (its ``credit()``), ``binary`` (1 when the task
    is done). A try that raises (or gives no finite number) is retried up to ``retries``
    times (``rollout.eval_retries``); when every try failed the rollout fails with
    ``failure`` ``evaluation`` (reward 0, the last problem in ``extra.reward_error``, the
    tries in ``extra.eval_tries``): it is dropped from training, not scored 0."""
    problem = ""
    for n in range(1, retries + 2):
        try:
            rollout.progress = env.graded() if isinstance(env, PluginEnv) else env.progress()
            rollout.reward = _reward(rollout, env, kind, fn)
        except Exception as e:
            problem = f"{type(e).__name__}: {e}"
            continue
        if n > 1:
            rollout.extra["eval_tries"] = n
        return
    rollout.reward, rollout.extra["reward_error"] = 0.0, problem
    rollout.extra["eval_tries"] = retries + 1
    if rollout.failure not in ("environment", "engine"):  # the first cause stays
        rollout.status, rollout.failure = "failed", "evaluation"


def _reward(rollout: Rollout, env: TaskEnv, kind: str, fn: Callable[..., Any] | None) -> float:
    if fn is not None:
        r = float(fn(rollout, env))
        if not math.isfinite(r):
            raise ValueError(f"the reward function returned {r}")
        return r
    if kind == "partial":
        return env.graded("credit") if isinstance(env, PluginEnv) else rollout.progress
    if kind == "binary":
        return 1.0 if rollout.progress >= 1.0 else 0.0
    return rollout.progress


__all__ = ["settle_reward"]
