"""Task environments as the agent harness sees them: text in, text out, partial progress.

:class:`TaskEnv` is the one protocol the harness drives. Besides ``reset``/``step`` it
exposes what long-horizon sessions need: ``progress()`` (the reward, kept on timeout),
``snapshot()``/``restore()`` (save points for retries), the simulated latency of the last
tool call, the task's *components* (sub-goals handed to sub-agents), whether the last step
failed in a way the agent cannot repair in place, and an oracle plan per component (used by
the scripted agent).

Adapters: :class:`RepoTaskEnv` over :class:`~gyre_core.envs.repo_suite.RepoEnv` and
:class:`CodingTaskEnv` over :class:`~gyre_core.envs.coding.CodingEnv`; :func:`make_env`
builds either from ``(suite, split, index, seed)``.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gyre_core.envs import coding, repo_suite
from gyre_core.envs.coding import CodingEnv
from gyre_core.envs.repo_suite import RepoEnv, TaskSpec

SUITES = ("repo", "coding")
SPLITS = repo_suite.SPLITS


@dataclass(frozen=True, slots=True)
class Component:
    """A sub-goal of a task: ``name`` identifies it, ``goal`` says what to do in words."""

    name: str
    goal: str


@runtime_checkable
class TaskEnv(Protocol):
    task_id: str
    multiline_actions: bool  # False: an action is one line of text

    def reset(self) -> str:
        """Start the episode; return the task prompt (the first observation)."""

    def step(self, action: str) -> tuple[str, bool]:
        """Act; return (observation text, episode done)."""

    def progress(self) -> float:
        """Share of the task done, in [0, 1]."""

    @property
    def tool_latency_s(self) -> float:
        """Simulated seconds the last step's tool took (0 before the first step)."""

    @property
    def last_failed(self) -> bool:
        """The last step revealed a failure that the agent cannot repair in place."""

    @property
    def last_error(self) -> bool:
        """The last action was malformed or refused (an error observation)."""

    def components(self) -> list[Component]: ...

    def component_done(self, index: int) -> bool: ...

    def oracle_actions(self, index: int) -> list[str]:
        """Actions that complete component ``index`` from a fresh state (the oracle)."""

    def finish_action(self) -> str | None:
        """The action that ends the episode once every component is done (None: none)."""

    def snapshot(self) -> Any: ...

    def restore(self, snap: Any) -> None: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- repo suite


class RepoTaskEnv:
    """The repository-building suite. Every component is one file; a check that fails on
    content (a wrong or missing value) is a failure: ``fix`` repairs only flaky setups."""

    multiline_actions = False

    def __init__(
        self, spec: TaskSpec, seed: int = 0, max_steps: int | None = None, *, hints: bool = False
    ) -> None:
        self.spec = spec
        self.task_id = spec.task_id
        self.env = RepoEnv(spec, max_steps=max_steps, seed=seed, hints=hints)
        self._latency = 0.0
        self._failed = False
        self._error = False

    def reset(self) -> str:
        self._latency, self._failed, self._error = 0.0, False, False
        return self.env.reset().text

    def step(self, action: str) -> tuple[str, bool]:
        obs = self.env.step(action)
        self._latency = obs.latency_s
        self._error = not obs.ok
        # "FAIL x: check crashed in setup" is repaired by `fix`; other FAILs mean the
        # file content is wrong, which in-place edits of a real repo rarely undo cleanly.
        self._failed = obs.text.startswith("FAIL") and "crashed in setup" not in obs.text
        return obs.text, obs.done

    def progress(self) -> float:
        return self.env.progress

    def credit(self) -> float:
        """The suite's finer partial credit (:attr:`RepoEnv.credit`), a shaped reward."""
        return self.env.credit

    @property
    def tool_latency_s(self) -> float:
        return self._latency

    @property
    def last_failed(self) -> bool:
        return self._failed

    @property
    def last_error(self) -> bool:
        return self._error

    def components(self) -> list[Component]:
        return [
            Component(
                c.name, f"build {c.name} at {c.path}: " + ", ".join(f"{k}={v}" for k, v in c.fields)
            )
            for c in self.spec.components
        ]

    def component_done(self, index: int) -> bool:
        return self.env.hidden_check(self.spec.components[index].name)

    def oracle_actions(self, index: int) -> list[str]:
        c = self.spec.components[index]
        actions = [f"create_file {c.path}"]
        actions += [f"write {c.path} {k} {v}" for k, v in c.fields]
        actions.append(f"run_check {c.name}")
        if c.flaky:
            actions += [f"fix {c.name}", f"run_check {c.name}"]
        return actions

    def finish_action(self) -> str | None:
        return "submit"

    def snapshot(self) -> Any:
        e = self.env
        return (copy.deepcopy(e._files), e.steps, e.done, e._rng.getstate())

    def restore(self, snap: Any) -> None:
        files, steps, done, rng = snap
        self.env._files = copy.deepcopy(files)
        self.env.steps, self.env.done = steps, done
        self.env._rng.setstate(rng)
        self._failed = self._error = False

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- coding suite

# Our own reference solutions for the built-in coding tasks (coding.py ships none).
REFERENCE_SOLUTIONS: dict[str, str] = {
    "fizzbuzz": (
        "def fizzbuzz(n: int) -> list[str]:\n"
        "    out = []\n"
        "    for i in range(1, n + 1):\n"
        "        word = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n"
        "        out.append(word or str(i))\n"
        "    return out\n"
    ),
    "palindrome": (
        "def is_palindrome(s: str) -> bool:\n"
        "    kept = [ch.lower() for ch in s if ch.isalnum()]\n"
        "    return kept == kept[::-1]\n"
    ),
    "word_count": (
        "import string\n\n\n"
        "def word_count(text: str) -> dict[str, int]:\n"
        "    counts: dict[str, int] = {}\n"
        "    for raw in text.split():\n"
        "        word = raw.strip(string.punctuation).lower()\n"
        "        if word:\n"
        "            counts[word] = counts.get(word, 0) + 1\n"
        "    return counts\n"
    ),
    "run_length": (
        "def rle(s: str) -> list[tuple[str, int]]:\n"
        "    out: list[tuple[str, int]] = []\n"
        "    for ch in s:\n"
        "        if out and out[-1][0] == ch:\n"
        "            out[-1] = (ch, out[-1][1] + 1)\n"
        "        else:\n"
        "            out.append((ch, 1))\n"
        "    return out\n"
    ),
}

_SKIP_DIRS = (".home", ".tmp")


class CodingTaskEnv:
    """The sandboxed coding suite: one component (the solution file), progress = share of
    hidden tests passed at ``submit``. Tools run for real (pytest in a child process), so
    their time is already on the real clock and ``tool_latency_s`` is 0."""

    multiline_actions = True

    def __init__(self, task: str, workdir: str | Path | None = None) -> None:
        self.env = CodingEnv(task, workdir=workdir)
        self.task_id = f"coding-{self.env.task.name}"
        self._failed = False
        self._error = False

    def reset(self) -> str:
        t = self.env.task
        return (
            f"Task {self.task_id}: {t.prompt}\n"
            "Tools: 'write_file PATH' followed by the file content on the next lines, "
            "'read_file PATH', 'run_tests' (visible tests), 'submit' (hidden tests, ends)."
        )

    def step(self, action: str) -> tuple[str, bool]:
        obs = self.env.step(action)
        self._error = obs.error
        rep = obs.report
        self._failed = rep is not None and not obs.done and rep.passed < rep.total
        return obs.text, obs.done

    def progress(self) -> float:
        return self.env.progress

    @property
    def workdir(self) -> Path:
        """The task's folder: an external agent works in it (``GYRE_TASK_DIR``)."""
        return self.env.root

    @property
    def tool_latency_s(self) -> float:
        return 0.0

    @property
    def last_failed(self) -> bool:
        return self._failed

    @property
    def last_error(self) -> bool:
        return self._error

    def components(self) -> list[Component]:
        return [Component("solution", f"make {self.env.task.module}.py pass the tests")]

    def component_done(self, index: int) -> bool:
        return self.env.done and self.env.progress >= 1.0

    def oracle_actions(self, index: int) -> list[str]:
        name = self.env.task.name
        if name not in REFERENCE_SOLUTIONS:
            raise ValueError(
                f"coding task {name!r} has no reference solution; the scripted agent "
                f"knows: {sorted(REFERENCE_SOLUTIONS)}"
            )
        body = REFERENCE_SOLUTIONS[name]
        return [f"write_file {self.env.task.module}.py\n{body}", "run_tests", "submit"]

    def finish_action(self) -> str | None:
        return None if self.env.done else "submit"

    def snapshot(self) -> Any:
        files: dict[str, str] = {}
        for p in self.env.root.rglob("*"):
            rel = p.relative_to(self.env.root)
            if p.is_file() and not _skipped(rel):
                files[str(rel)] = p.read_text(errors="replace")
        return files, self.env.done, self.env.progress, self.env.last_report

    def restore(self, snap: Any) -> None:
        files, done, progress, report = snap
        root = self.env.root
        for p in sorted(root.rglob("*"), reverse=True):  # children before their folders
            rel = p.relative_to(root)
            if _skipped(rel) or str(rel) in files:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        for rel_name, text in files.items():
            path = root / rel_name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.env.done, self.env.progress, self.env.last_report = done, progress, report
        self._failed = self._error = False

    def close(self) -> None:
        self.env.close()


def _skipped(rel: Path) -> bool:
    top = rel.parts[0] if rel.parts else ""
    return top in _SKIP_DIRS or top.startswith(".gyre")


# --------------------------------------------------------------------------- factory


def make_env(
    suite: str,
    split: str = "train",
    index: int | str = 0,
    seed: int = 0,
    *,
    suite_seed: int = 0,
    hints: bool = False,
) -> TaskEnv:
    """The ``index``-th task of ``suite`` (``"repo"`` or ``"coding"``) and ``split``.

    ``seed`` seeds the episode (tool latencies); ``suite_seed`` picks the repo suite's task
    list (as :func:`~gyre_core.envs.repo_suite.load_suite`); ``hints`` turns on the repo
    suite's status line. Every integer ``index >= 0`` is a task of every suite: the repo
    suite makes one per index (its sizes cycling with the index), and the coding suite's one
    pool of tasks (the same for every split) wraps around. ``index`` may also be a coding
    task's name."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; expected one of {', '.join(SUITES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    names = sorted(coding.TASKS)
    if suite == "coding" and isinstance(index, str):
        if index not in coding.TASKS:
            raise ValueError(f"unknown coding task {index!r}; known: {names}")
        return CodingTaskEnv(index)
    if isinstance(index, str) or index < 0:
        raise ValueError(f"{suite} suite index must be an integer >= 0, got {index!r}")
    if suite == "coding":
        return CodingTaskEnv(names[index % len(names)])
    return RepoTaskEnv(repo_spec(split, index, suite_seed), seed=seed, hints=hints)


def repo_spec(split: repo_suite.Split, index: int, suite_seed: int = 0) -> TaskSpec:
    """The repo suite's task ``index`` of ``split``: its size cycles with the index, its
    draw is seeded by the suite seed and the index."""
    size = repo_suite.SIZES[index % len(repo_suite.SIZES)]
    return repo_suite.make_task(split, size, suite_seed * 1_000_003 + index)


__all__ = [
    "REFERENCE_SOLUTIONS",
    "SUITES",
    "CodingTaskEnv",
    "Component",
    "RepoTaskEnv",
    "TaskEnv",
    "make_env",
    "repo_spec",
]
