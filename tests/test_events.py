"""The event kinds, defined once: names and fields as docs/architecture.md lists them, and the
JSON round trip."""

from __future__ import annotations

import io
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from gyre_core import events as ev
from gyre_core.scheduler.policies import Elastic
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import generate

ROOT = Path(__file__).resolve().parents[1]


def documented_kinds() -> dict[str, set[str]]:
    """The event table of docs/architecture.md: each row's kind and the fields its data
    column names (in backquotes)."""
    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not re.fullmatch(r" `\w+` ", cells[1]):
            continue
        rows[cells[1].strip(" `")] = set(re.findall(r"`(\w+)`", cells[2]))
    return rows


def test_kinds_and_fields_are_those_the_docs_list() -> None:
    assert {
        k: {f.name for f in fields(cls)} - {"t", "wall"} for k, cls in ev.EVENT_TYPES.items()
    } == documented_kinds()


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
