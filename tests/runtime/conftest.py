"""Shared by the real-runtime tests: the smallest real job (4 units, 2 steps) and a local
Ray cluster with one ``gpu_unit`` per unit, started once per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray

from gyre_core.runtime.ray_backend import start_ray

TINY_JOB: dict[str, Any] = {
    "steps": 2,
    "cluster": {"units": 4},
    "scheduler": {"drain_deadline_s": 0.0},
    "rollout": {
        "tasks_per_step": 1,
        "group_size": 2,
        "benchmark_tasks": 1,
        "max_turns": 4,
        "max_new_tokens": 12,
    },
}


def tiny_job(policy: str | None = None) -> dict[str, Any]:
    """A copy of :data:`TINY_JOB`, under ``policy`` when given."""
    job = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY_JOB.items()}
    if policy is not None:
        job["scheduler"]["policy"] = policy
    return job


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    start_ray("", 4, 1, 128)
    yield
    ray.shutdown()


class UnitKiller:
    """An event sink that records every event and each unit's role, and kills one unit's
    actor (``ray.kill``) at the first event of kind ``on``: the unit that ``pick`` chooses
    from the units currently in ``role``."""

    def __init__(self, on: str, role: str, pick: Any = max) -> None:
        from gyre_core.events import ListSink

        self.sink, self.on, self.role, self.pick = ListSink(), on, role, pick
        self.roles: dict[int, str] = {}
        self.killed: list[int] = []

    @property
    def events(self) -> list[Any]:
        return self.sink.events

    def emit(self, e: Any) -> None:
        self.sink.emit(e)
        if e.kind == "role_change":
            self.roles[e.unit] = e.to_role
        if e.kind == self.on and not self.killed:
            unit = self.pick(u for u, r in self.roles.items() if r == self.role)
            (name,) = [a for a in ray.util.list_named_actors() if a.endswith(f"-unit-{unit}")]
            ray.kill(ray.get_actor(name))
            self.killed.append(unit)
