"""The run loop's batching with GRPO groups (rollout.group_size 2, a step of 2 tasks):
what its snapshot counts ready is what a step can take (whole groups, the oldest policy
version first), and a complete group past the staleness bound leaves the loop untrained,
counted, with as many new sessions in its place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime.loop import Loop, LoopStart
from gyre_core.runtime.step_books import StepBooks
from gyre_core.train.checkpoint import SHARDED_FORMAT
from gyre_core.train.checkpoint_dirs import STATE_FILE
from gyre_core.trajectory.format import Call, Rollout
from gyre_core.trajectory.writer import write_rollouts
from tests.runtime.conftest import tiny_job
from tests.runtime.test_publish import loop_over


def finished(idx: int, *versions: int) -> Rollout:
    """Rollout ``r<idx>`` with one call whose tokens were decoded by ``versions`` (none:
    it failed before its first call)."""
    calls = []
    if versions:
        n = len(versions)
        calls = [
            Call(
                f"c{idx}",
                np.arange(3),
                np.arange(n),
                np.zeros(n),
                np.array(versions, dtype=np.int64),
            )
        ]
    return Rollout(f"r{idx}", f"t{idx // 2}", "failed" if not versions else "completed", 1.0, calls)


def loop_of(tmp_path: Path, batch_order: str, staleness: int = 2) -> Loop:
    job = tiny_job("async")
    job["rollout"]["tasks_per_step"] = 2  # steps of 4: two groups of 2
    job["scheduler"].update(batch_order=batch_order, staleness_bound=staleness)
    job["steps"] = 3
    return loop_over(tmp_path, [object()], job)  # trained version 3: the next step's is 3


def test_a_step_takes_whole_groups_oldest_version_first_and_snapshot_counts_them(
    tmp_path: Path,
) -> None:
    loop = loop_of(tmp_path, "arrival")
    loop.pending = []
    # finish order: r4 (group 2), r0, r2 (group 1), r1 (group 0 done), r5 (group 2 done),
    # r3 (group 1 done): groups 0, 2 and 1 complete; group 1 holds the oldest tokens
    loop.ready = [finished(4, 3), finished(0, 3), finished(2, 1, 2), finished(1, 3)]
    assert loop.snapshot(loop.units).ready == 2  # only {r0, r1}; r2, r4 wait for members
    loop.ready += [finished(5, 2, 3), finished(3)]  # r3 failed: still a finished member
    picked = [loop.ready[p].rollout_id for p in loop._usable()[: loop.per_step]]
    assert picked == ["r2", "r3", "r4", "r5"]  # versions 1, then 2; {r0, r1} (3) waits
    assert loop.snapshot(loop.units).ready == 6


def test_a_stale_group_is_dropped_counted_and_replaced_by_new_sessions(tmp_path: Path) -> None:
    loop = loop_of(tmp_path, "arrival", staleness=1)  # version 3 trains tokens of >= 2
    loop.pending = [6, 7]
    loop.ready = [finished(0, 1), finished(1, 0, 1), finished(2, 1), finished(3, 2)]
    loop._drop_stale()
    assert [r.rollout_id for r in loop.ready] == ["r2", "r3"]  # {r2, r3} has a version 2
    assert loop.groups_dropped == 1
    assert loop.pending == [6, 7, 12, 13]  # the run's 12 sessions, then two more
    assert loop.snapshot(loop.units).ready == 2


def test_index_and_single_rollout_groups_keep_their_order(tmp_path: Path) -> None:
    loop = loop_of(tmp_path, "index", staleness=0)
    loop.pending = []
    loop.ready = [finished(i, 0) for i in (13, 12, 15, 14)]  # step 3's own: all stale
    loop._drop_stale()
    assert loop.groups_dropped == 0 and len(loop.ready) == 4  # index drops nothing
    assert [loop.ready[p].rollout_id for p in loop._usable()] == ["r12", "r13", "r14", "r15"]


def test_a_resumed_loop_replaces_dropped_groups_past_every_index_it_ran(tmp_path: Path) -> None:
    loop = loop_of(tmp_path, "arrival", staleness=1)
    resumed = Loop(
        loop.plan,
        policy=loop.policy,
        units=loop.units,
        router=loop.router,
        trainer=loop.trainer,
        sink=loop.sink,
        clock=loop.clock,
        start_session=loop.start_session,
        on_step=loop.on_step,
        start=LoopStart(pending=[], first_new=15),  # r12..r14 replaced groups before it
    )
    resumed.ready = [finished(0, 1), finished(1, 0)]
    resumed._drop_stale()
    assert resumed.pending == [16, 17]  # a whole group again: past r14, on a group's start


def test_restore_names_the_first_index_past_every_rollout_the_run_ran(tmp_path: Path) -> None:
    job = tiny_job("async")
    job["rollout"]["tasks_per_step"], job["steps"] = 2, 3  # 12 sessions, groups of 2
    cfg = RunConfig.from_dict(job)
    ckpt = tmp_path / "step-00000002"
    ckpt.mkdir()
    trained = ["r0", "r1", "r4", "r5", "r12", "r13"]  # r12, r13 replaced a dropped group
    state = {"format": SHARDED_FORMAT, "version": 2, "data_position": {"trained": trained}}
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    write_rollouts(ckpt / "ready.jsonl", [finished(14, 1), finished(2, 1)])
    restored = StepBooks(cfg, ListSink(), lambda: 0.0).restore(tmp_path)
    assert restored is not None
    _, version, ready, pending, first_new = restored
    assert version == 2 and [r.rollout_id for r in ready] == ["r14", "r2"]
    assert pending == [3, 6, 7, 8, 9, 10, 11] and first_new == 15
