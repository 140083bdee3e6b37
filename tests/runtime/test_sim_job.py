import json

import pytest

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from tests.gyre_cli import gyre

SIM = {"backend": "sim", "steps": 3, "sim": {"rollouts": 96, "gpus": 16, "rollouts_per_step": 32}}


def test_sim_job_emits_the_run_and_its_steps(tmp_path) -> None:
    sink = ListSink()
    out = run_job(RunConfig.from_dict(SIM), sink=sink, workdir=tmp_path)
    kinds = [e.kind for e in sink.events]
    assert out["status"] == "succeeded" and out["steps"] == 3
    assert kinds.count("step_finished") == 3 and kinds[-1] == "run_status"
    assert kinds.count("rollout_finished") == 96


def test_elastic_knobs_in_the_config_reach_the_policy(tmp_path) -> None:
    """scheduler.elastic_* are the policy's knobs: a larger train share trains on 3 of the 4
    simulated units from the start, a fuller engine fill changes the schedule."""
    four = {**SIM, "sim": {**SIM["sim"], "gpus": 32}}

    def run(knobs: dict) -> tuple[list[str], float]:
        sink = ListSink()
        cfg = RunConfig.from_dict({**four, "scheduler": {"policy": "elastic", **knobs}})
        out = run_job(cfg, sink=sink, workdir=tmp_path / str(len(list(tmp_path.iterdir()))))
        first: dict[int, str] = {}  # each unit's initial role, its first role change
        for e in sink.events:
            if e.kind == "role_change":
                first.setdefault(e.unit, e.to_role)
        return [first[u] for u in range(4)], out["makespan_s"]

    roles, makespan = run({})
    assert roles == ["train", "train", "rollout", "rollout"]
    assert run({"elastic_train_share": 0.75})[0][:3] == ["train"] * 3
    assert run({"elastic_fill": 1.0})[1] != makespan


def test_should_stop_cancels_promptly(tmp_path) -> None:
    sink = ListSink()
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 20

    out = run_job(RunConfig.from_dict(SIM), sink=sink, workdir=tmp_path, should_stop=stop)
    assert out["status"] == "cancelled"
    assert len(sink.events) == 22  # 21 forwarded, then the cancelled status
    assert sink.events[-1].status == "cancelled"


def test_gyre_run_json_summary_is_the_last_line(tmp_path) -> None:
    cfg = tmp_path / "sim.json"
    cfg.write_text(json.dumps({**SIM, "scheduler": {"policy": "colocate"}}))
    out = gyre("run", str(cfg), "--json", "--workdir", str(tmp_path / "w"))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["policy"] == "colocate" and summary["sessions_restarted"] == 0
    assert "step 3" in out.stderr


def _stream(events) -> list[tuple]:
    """What an event says, without its wall clock."""
    return [(e.kind, e.t, tuple(sorted((k, repr(v)) for k, v in e.data().items()))) for e in events]


# Colocate spreads the steps out: step_finished is the 72nd, 145th and 218th of 219 events.
COLOCATE = {**SIM, "scheduler": {"policy": "colocate"}}


@pytest.mark.parametrize("stop_after", [5, 100])  # before step 1; inside step 2
def test_a_resumed_sim_run_continues_where_it_stopped(tmp_path, stop_after) -> None:
    cfg = RunConfig.from_dict(COLOCATE)
    full = ListSink()
    run_job(cfg, sink=full, workdir=tmp_path / "full")
    first, resumed = ListSink(), ListSink()
    out = run_job(
        cfg, sink=first, workdir=tmp_path, should_stop=lambda: len(first.events) >= stop_after
    )
    assert out["status"] == "cancelled" and first.events[-1].status == "cancelled"
    out = run_job(cfg, sink=resumed, workdir=tmp_path, resume=True)
    assert out["status"] == "succeeded" and out["steps"] == 3
    # The stopped part and the resumed part are the uninterrupted run, each event once.
    assert _stream(first.events[:-1] + resumed.events) == _stream(full.events)
    assert [e.step for e in first.events + resumed.events if e.kind == "step_finished"] == [1, 2, 3]


def test_a_checkpoint_of_another_config_is_not_resumed(tmp_path) -> None:
    first = ListSink()
    run_job(
        RunConfig.from_dict(COLOCATE),
        sink=first,
        workdir=tmp_path,
        should_stop=lambda: len(first.events) >= 100,
    )
    other = ListSink()
    run_job(RunConfig.from_dict({**COLOCATE, "seed": 1}), sink=other, workdir=tmp_path, resume=True)
    assert [e.step for e in other.events if e.kind == "step_finished"] == [1, 2, 3]


def test_stale_groups_are_dropped_counted_on_each_step_and_the_run_still_finishes(
    tmp_path,
) -> None:
    """Staleness bound 0, sessions admitted two versions ahead: whole groups finish with
    every token too old, are dropped (not trained), counted in the step's
    ``groups_dropped_stale``, and replaced by new sessions, so all three steps run."""
    sink = ListSink()
    sched = {"staleness_bound": 0, "admission_staleness": 2}
    out = run_job(RunConfig.from_dict({**SIM, "scheduler": sched}), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 3
    dropped = [e.metrics["groups_dropped_stale"] for e in sink.events if e.kind == "step_finished"]
    assert sum(dropped) >= 1
    started = sum(e.kind == "rollout_started" for e in sink.events)
    assert started == 96 + 4 * sum(dropped)  # rollout.group_size 4: a group's 4 again
