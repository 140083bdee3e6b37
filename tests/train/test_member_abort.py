"""A lost peer under a collective: the survivor's blocked step is aborted from another
thread and returns with an error at once, and the run goes on from its periodic offload.

Two units of one process each (gloo, real processes) take a step, write a sharded
checkpoint (the periodic offload) and take another step. Then unit 1 freezes (SIGSTOP: its
connections stay open, as a node that vanished or a hung GPU, so nothing tells unit 0) while
unit 0 is inside the next step's first collective. The test, as the driver, then asks unit 0
to abort (``TrainMember.abort``, what the actor's ``abort_group`` calls from its own loop):
the step must raise within a few seconds of it, not after the collective timeout. Unit 0
then forms a group alone from the offload and holds exactly its weights, and trains.
Where no abort comes, the step fails after ``GYRE_COLLECTIVE_TIMEOUT_S`` (5 s here): the
timeout reaches the groups FSDP2's collectives run on (the mesh's), not only the default
group."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gyre_core.train.sharded_checkpoint import read_checkpoint
from tests.train.members import Place, free_port, member_for, step
from tests.train.test_trainer import sample_rollouts, tiny_model

pytestmark = pytest.mark.slow
DEADLINE_S = 90  # the survivor's whole run; the collective timeout is 120 s (300 s before)
ABORT_WITHIN_S = 5.0
TIMEOUT_S = 5  # GYRE_COLLECTIVE_TIMEOUT_S of the timeout case


def _batch(version: int) -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=2, group_size=4, length=6, seed=version,
                           version=version)  # fmt: skip


def _process(index: int, port: int, model_dir: str, tmp: str, events: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    place = Place(index, 1, port)
    place.open_store()
    member, plan, bound = member_for(model_dir)
    spec = place.spec([0, 1], 0, "init")
    assert spec is not None
    place.form(member, spec)
    step(member, plan, bound, _batch(0), 0, spec.rank, 2)
    member.save(f"{tmp}/offload", 1)  # the periodic offload, as TrainGroup.save writes it
    step(member, plan, bound, _batch(1), 1, spec.rank, 2)
    if index == 1:
        events["frozen"].set()
        os.kill(os.getpid(), signal.SIGSTOP)  # lost: never comes back
        return
    aborted: dict[str, float] = {}

    def watch() -> None:  # the actor's other loop: abort_group
        events["abort"].wait()
        aborted["t"] = time.monotonic()
        member.abort()

    threading.Thread(target=watch, daemon=True).start()
    error, t0 = "", time.monotonic()
    try:
        step(member, plan, bound, _batch(2), 2, spec.rank, 2)
    except Exception as exc:  # the blocked collective, ended by the abort or the timeout
        error = type(exc).__name__
    end = time.monotonic()
    returned = end - aborted.get("t", t0)
    alone = place.spec([0], 1, "checkpoint", path=f"{tmp}/offload", version=3)
    assert alone is not None
    place.form(member, alone)
    weights = member.gather()
    step(member, plan, bound, _batch(3), 3, 0, 1)
    torch.save(weights, f"{tmp}/restored.pt")
    Path(f"{tmp}/result.json").write_text(json.dumps({"error": error, "returned_s": returned}))
    member.leave()
    os._exit(0)


@pytest.mark.parametrize("ends_by", ["abort", "timeout"])
def test_an_aborted_collective_returns_at_once_and_the_run_resumes_from_the_offload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ends_by: str
) -> None:
    if ends_by == "timeout":  # the spawned processes inherit it
        monkeypatch.setenv("GYRE_COLLECTIVE_TIMEOUT_S", str(TIMEOUT_S))
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    ctx = multiprocessing.get_context("spawn")
    events = {"frozen": ctx.Event(), "abort": ctx.Event()}
    port = free_port()
    procs = [
        ctx.Process(target=_process, args=(i, port, str(model_dir), str(tmp_path), events))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    try:
        assert events["frozen"].wait(DEADLINE_S), "unit 1 never reached its lost step"
        time.sleep(2.0)  # unit 0 is now blocked inside the step's first collective
        if ends_by == "abort":
            events["abort"].set()
        procs[0].join(DEADLINE_S)
        assert not procs[0].is_alive(), "the survivor is still blocked in the collective"
        assert procs[0].exitcode == 0, f"the survivor failed (exit {procs[0].exitcode})"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["error"], "the blocked step returned without an error"
    within = ABORT_WITHIN_S if ends_by == "abort" else TIMEOUT_S + 20.0
    assert result["returned_s"] < within, f"returned {result['returned_s']:.1f} s after"
    restored = torch.load(tmp_path / "restored.pt")
    saved = read_checkpoint(tmp_path / "offload")["model"]
    assert restored.keys() == saved.keys()
    assert all(torch.equal(restored[k], saved[k]) for k in saved), "not the offload's weights"
