"""The event kinds of DESIGN.md, defined once: names, fields and the JSON round trip."""

from __future__ import annotations

import io
import json
from dataclasses import fields

import pytest

from gyre_core import events as ev
from gyre_core.scheduler.policies import Elastic
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate

DESIGN_KINDS = {
    "run_status": {"status", "step", "message"},
    "role_change": {"unit", "gpus", "from_role", "to_role", "node"},
    "rollout_started": {"rollout_id", "task_id", "group_id", "step"},
    "rollout_progress": {"rollout_id", "turns", "tokens", "progress", "branches"},
    "rollout_finished": {
        "rollout_id",
        "status",
        "progress",
        "reward",
        "turns",
        "tokens",
        "versions",
    },
    "call_migrated": {"rollout_id", "from_unit", "to_unit", "tokens_kept"},
    "step_finished": {"step", "version", "metrics"},
    "benchmark": {"step", "suite", "score", "tasks"},
    "tree_ready": {"group_id", "rollouts", "tokens_unique", "tokens_per_call", "nodes"},
    "rollouts_written": {"step", "path", "rollouts", "groups"},
    "phase_progress": {"phase", "done", "total", "message"},
}


def test_kinds_and_fields_are_those_of_the_design() -> None:
    assert {
        k: {f.name for f in fields(cls)} - {"t", "wall"} for k, cls in ev.EVENT_TYPES.items()
    } == DESIGN_KINDS


def test_a_simulated_run_streams_events_that_parse_back() -> None:
    buf = io.StringIO()
    costs = CostModel(gpus=32, rollouts_per_step=16, max_seqs_per_unit=16)
    Simulator(generate("mixed", 32, 1), costs, Elastic(), sink=ev.JsonlSink(buf)).run()
    lines = buf.getvalue().splitlines()
    parsed = [ev.event_from_json(json.loads(line)) for line in lines]
    assert [json.loads(json.dumps(e.to_json())) for e in parsed] == [json.loads(x) for x in lines]
    kinds = {e.kind for e in parsed}
    assert {"run_status", "rollout_started", "rollout_finished", "step_finished"} <= kinds
    times = [e.t for e in parsed]
    assert times == sorted(times)  # the run's clock never goes back
    assert sum(isinstance(e, ev.StepFinished) for e in parsed) == 2


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown event kind 'nope'"):
        ev.event_from_json({"kind": "nope", "t": 0, "wall": "", "data": {}})


def test_event_text_is_made_storable_once_in_to_json() -> None:
    e = ev.StepFinished(t=1.0, step=1, version=1, metrics={"lo\x00ss": 0.5})
    assert e.to_json()["data"]["metrics"] == {"lo\u2400ss": 0.5}
    assert ev.storable({"a": ["x\x00", ("\ud800", 3)], "b": None}) == {
        "a": ["x\u2400", ("\ufffd", 3)],
        "b": None,
    }
    assert ev.storable_text("plain ✓") == "plain ✓"


def test_non_finite_numbers_become_null_in_to_json() -> None:
    e = ev.StepFinished(
        t=1.0, step=1, version=1, metrics={"loss": float("nan"), "kl": float("inf"), "r": 0.5}
    )
    assert e.to_json()["data"]["metrics"] == {"loss": None, "kl": None, "r": 0.5}
    json.dumps(e.to_json(), allow_nan=False)  # strict JSON: what Postgres' jsonb takes


def test_phase_progress_round_trips_and_reads_as_one_terminal_line() -> None:
    from gyre_core.runtime.progress import ProgressSink

    e = ev.PhaseProgress(
        t=12.5, phase="warm start", done=250, total=1000, message="loss 0.412 (target 0.12)"
    )
    back = ev.event_from_json(json.loads(json.dumps(e.to_json())))
    assert back == e and back.kind == "phase_progress"
    lines: list[str] = []
    sink = ProgressSink(lines.append)
    sink.emit(back)
    sink.emit(ev.PhaseProgress(t=13.0, phase="engine start", done=1, total=2))
    assert lines == ["warm start 250/1000, loss 0.412 (target 0.12)", "engine start 1/2"]
