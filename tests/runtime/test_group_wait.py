"""A change of the training group waits for whatever holds the group (a step, a weight
gather, a checkpoint), and says how long in its parts (``group_wait_s``), so that a switch
out of training shows where its seconds went."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from gyre_core.config import RunConfig
from gyre_core.runtime.train_group import TrainGroup


def test_a_unit_leaving_while_the_group_is_held_reports_the_wait(tmp_path: Path) -> None:
    group = TrainGroup(RunConfig.from_dict({}), tmp_path)
    unit = SimpleNamespace(id=0, dead=False)

    async def leave_while_held() -> tuple[dict[str, float], dict[str, float]]:
        free = await group.leave(unit)  # nothing holds the group
        await group.lock.acquire()  # as a running step does
        leaving = asyncio.create_task(group.leave(unit))
        await asyncio.sleep(0.3)
        group.lock.release()
        return free, await leaving

    free, held = asyncio.run(leave_while_held())
    assert free["group_wait_s"] < 0.1
    assert held["group_wait_s"] >= 0.25
