"""The built-in suites as environment plugins: ``rollout.suite: repo`` runs :class:`RepoSuite`
and ``rollout.suite: coding`` runs :class:`CodingSuite`, through the same protocol and the
same code as a user's ``rollout.env`` class (:mod:`~gyre_core.rollout.plugins`): built from a
task dict and an episode seed, over their own task lists (``tasks(split)``). They also have
the protocol's optional members (sub-goals, save points, an oracle, tool latency, finer
credit); that is all that sets them apart.

Either may be named in ``rollout.env`` too (``gyre_core.rollout.suites:CodingSuite``); the
repo suite then has its class defaults (short tasks, no hints, suite seed 0), and
``rollout.suite`` with ``rollout.size`` / ``rollout.hints`` binds others (:func:`builtin`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

from gyre_core.envs import coding, repo_suite
from gyre_core.rollout.task_env import SUITES, CodingTaskEnv, RepoTaskEnv, repo_spec

ENDLESS = 2**31 - 1  # a generated task list's length: any index a run asks for is a task


class Generated(Sequence[dict[str, Any]]):
    """A task list made on demand: task ``k`` is ``make(k)``."""

    def __init__(self, make: Callable[[int], dict[str, Any]], n: int = ENDLESS) -> None:
        self.make, self.n = make, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, k: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, k: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, k: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(k, slice):
            return [self.make(i) for i in range(*k.indices(self.n))]
        if not 0 <= k < self.n:
            raise IndexError(k)
        return self.make(k)


class RepoSuite(RepoTaskEnv):
    """The repository-building suite: an endless, generated task list per split, task ``k``
    of size ``size`` drawn with the suite seed ``suite_seed`` (the sizes share one index
    space: task ``k`` of a size is index ``3k + position of the size``)."""

    size = "short"
    hints = False
    suite_seed = 0

    def __init__(self, task: dict[str, Any], seed: int) -> None:
        spec = repo_spec(task["split"], int(task["index"]), int(task["suite_seed"]))
        super().__init__(spec, seed=seed, hints=bool(task.get("hints", False)))

    @classmethod
    def tasks(cls, split: str) -> Sequence[dict[str, Any]]:
        sizes = repo_suite.SIZES
        pos = sizes.index(cls.size)

        def make(k: int) -> dict[str, Any]:
            index = k * len(sizes) + pos  # its size's k-th task
            return {"split": split, "index": index, "suite_seed": cls.suite_seed,
                    "hints": cls.hints}  # fmt: skip

        return Generated(make)


class CodingSuite(CodingTaskEnv):
    """The coding suite: its small pool of tasks (the same for every split), each played in
    a folder of its own (``workdir``, where an external agent works)."""

    def __init__(self, task: dict[str, Any], seed: int) -> None:
        super().__init__(str(task["name"]))

    @classmethod
    def tasks(cls, split: str) -> list[dict[str, Any]]:
        names = sorted(coding.TASKS)
        # the order a run has always drawn them in (index 3k of the shared index space)
        return [{"name": names[(3 * k) % len(names)]} for k in range(len(names))]


def builtin(name: str, *, size: str = "short", hints: bool = False, suite_seed: int = 0) -> type:
    """The built-in suite ``name`` as a plugin class, its settings bound."""
    if name == "coding":
        return CodingSuite
    if name != "repo":
        raise ValueError(f"unknown suite {name!r}; expected one of {', '.join(SUITES)}")
    if size not in repo_suite.SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(repo_suite.SIZES)}")
    attrs = {"size": size, "hints": hints, "suite_seed": suite_seed}
    return type("RepoSuite", (RepoSuite,), {"__module__": __name__, **attrs})


__all__ = ["SUITES", "CodingSuite", "Generated", "RepoSuite", "builtin"]
