"""An environment plugin for the tests, as a user writes one: nothing of Gyre imported."""

from __future__ import annotations


class WordEnv:
    """Say the task's word: progress 1 when an action contains it, within 3 steps."""

    def __init__(self, task: dict, seed: int) -> None:
        self.word, self.seed = task["word"], seed
        self.steps, self.said = 0, False

    @classmethod
    def tasks(cls, split: str) -> list[dict]:
        return [{"id": f"{split}-{w}", "word": w} for w in ("apple", "pear")]

    def reset(self) -> str:
        if self.word == "boom":
            raise RuntimeError("the task could not start")
        return f"Say the word {self.word}."

    def step(self, action: str) -> tuple[str, bool]:
        if self.word == "crash":
            raise KeyError("a bug in the environment")
        self.steps += 1
        self.said = self.said or self.word in action
        return ("yes" if self.said else "no"), self.said or self.steps >= 3

    def progress(self) -> float:
        return 1.0 if self.said else self.steps / 10


def reward(rollout, env) -> float:  # type: ignore[no-untyped-def]
    """A reward function: the progress, less 0.01 a call."""
    if env.task_id.endswith("nan"):
        return float("nan")
    return env.progress() - 0.01 * len(rollout.calls)


def broken_reward(rollout, env) -> float:  # type: ignore[no-untyped-def]
    raise ValueError("cannot score")
