"""Runs that report from elsewhere (``gyre run CONFIG --report-to URL``): created active,
their events sent in numbered batches by the reporter itself, never launched or reaped.

A batch carries the reporter's sequence number of its first event. The run keeps the last
one stored (``reported_seq``), so a batch sent again (its answer was lost) stores nothing
twice and a batch that skips ahead is refused with the number expected; the reporter
resends from there. A terminal ``run_status`` ends the run; a stop requested from the web
reaches the reporter in every batch's answer."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from django.db import transaction
from django.utils import timezone

from gyre_core.events import EVENT_TYPES
from gyre_web.cluster.services import record_role_changes
from gyre_web.runs import services
from gyre_web.runs.logs import lines_of_events
from gyre_web.runs.models import ACTIVE, Experiment, Run, Source, Status
from gyre_web.trajectories.services import record_rollout_events

ENDED = {"succeeded": Status.SUCCEEDED, "failed": Status.FAILED, "cancelled": Status.CANCELLED}
# Rollout events but the step files: those are paths on the reporter's machine, which the
# platform must never open (a reported run's trees come through the import endpoint).
ROLLOUT_KINDS = frozenset({"rollout_started", "rollout_progress", "rollout_finished"})
MAX_BATCH = 5000  # events in one batch
INT_LIMIT = 2**31  # a step or count fits the platform's integer columns


class BatchRejected(ValueError):
    """A batch that cannot be stored: ``status`` 400 (bad input, ``field`` names it) or
    409 (out of order, or the run no longer takes events); ``expected`` the sequence
    number the run takes next."""

    def __init__(self, status: int, field: str, problem: str, expected: int) -> None:
        super().__init__(problem)
        self.status, self.field, self.problem, self.expected = status, field, problem, expected


@transaction.atomic
def create_reported_run(
    *, experiment: Experiment, config: dict[str, Any], created_by: Any = None, name: str = ""
) -> Run:
    """A run whose events a reporter sends: validated like a launched one, running at once."""
    run = services.create_run(
        experiment=experiment,
        config=config,
        created_by=created_by,
        name=name,
        launch=False,
        source=Source.REPORTED,
    )
    services.transition(run.pk, Status.STARTING)
    return services.transition(run.pk, Status.RUNNING)


def _conforms(value: Any, tp: Any) -> bool:
    """Whether a JSON value fits an event field's declared type (``int``, ``float``,
    ``str``, ``list[...]``, ``dict[str, ...]``, ``tuple[int, int]``). A float may arrive
    null: events store NaN and infinities so."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < INT_LIMIT
    if tp is float:
        if value is None:
            return True
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and (math.isfinite(value) and abs(value) < 1e300)
        )
    if tp is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is tuple:
        return (
            isinstance(value, list)
            and len(value) == len(args)
            and all(_conforms(v, a) for v, a in zip(value, args, strict=True))
        )
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(k, str) and _conforms(v, args[1]) for k, v in value.items()
        )
    return False


def _event(e: Any) -> dict[str, Any]:
    """A reported event checked against its kind's fields -> as stored (``to_json``)."""
    if not isinstance(e, dict):
        raise ValueError("not an object")
    cls = EVENT_TYPES.get(e.get("kind"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown kind {e.get('kind')!r}")
    if not _conforms(e.get("t"), float) or e.get("t") is None:
        raise ValueError("t: a finite number of seconds")
    data = e.get("data")
    if not isinstance(data, dict):
        raise ValueError("data: an object")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - {"t", "wall"}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.name in names
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    }
    unknown, missing = sorted(set(data) - names), sorted(required - set(data))
    if unknown or missing:
        raise ValueError(f"data: unknown {unknown}, missing {missing}")
    for name, value in data.items():
        if not _conforms(value, hints[name]):
            raise ValueError(f"data.{name}: not a {hints[name]}")
    if cls.kind == "rollout_finished":
        data = {**data, "versions": tuple(data["versions"])}
    wall = e.get("wall") if isinstance(e.get("wall"), str) else timezone.now().isoformat()
    return cls(t=float(e["t"]), wall=wall[:40], **data).to_json()


def _checked(events: Any, expected: int) -> list[dict[str, Any]]:
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_BATCH:
        raise BatchRejected(400, "events", f"a list of 1 to {MAX_BATCH} events", expected)
    out = []
    for i, e in enumerate(events):
        try:
            out.append(_event(e))
        except ValueError as err:
            raise BatchRejected(400, f"events[{i}]", f"not an event: {err}", expected) from None
    return out


@transaction.atomic
def ingest(*, run_id: int, first: int, events: Any) -> dict[str, Any]:
    """Store the events of a batch the run has not stored yet -> ``{"stored", "next",
    "stop"}`` (how many were new, the sequence number the run takes next, the stop the
    web asked for: "", "cancel" or "pause"). Raises :class:`BatchRejected`."""
    run = Run.objects.select_for_update().get(pk=run_id)
    expected = run.reported_seq + 1
    if run.source != Source.REPORTED:
        raise BatchRejected(409, "run", "a launched run takes no reported events", expected)
    if isinstance(first, bool) or not isinstance(first, int) or first < 1:
        raise BatchRejected(400, "first", "the sequence number of the batch's first event", 0)
    checked = _checked(events, expected)
    if first > expected:
        raise BatchRejected(409, "first", f"events before {first} are missing", expected)
    fresh = checked[expected - first :]
    if fresh and run.status not in ACTIVE:
        raise BatchRejected(409, "run", f"the run is {run.status}", expected)
    if fresh:
        rows = services.append_events(run_id=run.pk, events=fresh)
        record_rollout_events(
            run_id=run.pk, events=[e for e in fresh if e["kind"] in ROLLOUT_KINDS]
        )
        record_role_changes(run_id=run.pk, events=[e for e in fresh if e["kind"] == "role_change"])
        services.append_log_lines(run_id=run.pk, lines=lines_of_events(fresh))
        Run.objects.filter(pk=run.pk).update(reported_seq=expected - 1 + len(fresh))
        last = rows[-1].seq
        transaction.on_commit(lambda: services.wake_subscribers(run.pk, last))
        _end_if_finished(run.pk, fresh)
    run.refresh_from_db()
    return {"stored": len(fresh), "next": run.reported_seq + 1, "stop": run.stop_requested}


def _end_if_finished(run_id: int, events: list[dict[str, Any]]) -> None:
    ended = [e for e in events if e["kind"] == "run_status" and e["data"]["status"] in ENDED]
    if not ended:
        return
    data = ended[-1]["data"]
    error = str(data.get("message", ""))[:500] if data["status"] == "failed" else ""
    services.transition(run_id, ENDED[data["status"]], error=error)
