"""Writes for a run's log lines (``RunLogLine``): the runtime's and the worker's lines,
numbered per run from 1. Each line is made storable (NUL becomes ␀, see
``gyre_core.events.storable_text``) and cut to ``MAX_LINE_CHARS``; a run keeps at most
``GYRE_RUN_LOG_MAX_LINES`` lines, the last of which says that the limit was reached."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gyre_core.events import PhaseProgress, storable_text
from gyre_web.runs.models import LogLevel, LogSource, Run, RunLogLine

MAX_LINE_CHARS = 4000  # a longer line is cut, marked with "…"
LEVELS = [level.value for level in LogLevel]  # in rising severity


def level_name(levelno: int) -> str:
    """A ``logging`` level number as a stored level (CRITICAL counts as error)."""
    if levelno >= 40:
        return LogLevel.ERROR
    if levelno >= 30:
        return LogLevel.WARNING
    return LogLevel.INFO if levelno >= 20 else LogLevel.DEBUG


def clean_text(text: str) -> str:
    text = storable_text(str(text)).rstrip("\n")
    if len(text) > MAX_LINE_CHARS:
        text = text[: MAX_LINE_CHARS - 1] + "…"
    return text


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    parsed = parse_datetime(value) if isinstance(value, str) else None
    return parsed or timezone.now()


@transaction.atomic
def append_log_lines(*, run_id: int, lines: list[dict[str, Any]]) -> list[RunLogLine]:
    """Store ``lines`` ({time, source, level, text}) after the run's last one. Lines past
    the run's limit are dropped (one line says so). -> the rows written."""
    if not lines:
        return []
    Run.objects.select_for_update().only("id").get(pk=run_id)  # one writer at a time
    last = RunLogLine.objects.filter(run_id=run_id).aggregate(m=Max("seq"))["m"] or 0
    cap = max(1, int(settings.GYRE_RUN_LOG_MAX_LINES))
    room = cap - last
    if room <= 0:
        return []
    if len(lines) > room:
        said = (
            f"log limit reached ({cap} lines, GYRE_RUN_LOG_MAX_LINES): later lines are not stored"
        )
        lines = [*lines[: room - 1], {"source": "worker", "level": "warning", "text": said}]
    rows = [
        RunLogLine(
            run_id=run_id,
            seq=last + 1 + i,
            time=_time(line.get("time")),
            source=line.get("source") if line.get("source") in LogSource.values else "runtime",
            level=line.get("level") if line.get("level") in LEVELS else LogLevel.INFO,
            text=clean_text(line.get("text", "")),
        )
        for i, line in enumerate(lines)
    ]
    return RunLogLine.objects.bulk_create(rows)


def lines_of_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The log lines a reported run's events make (its reporter sends events, not its
    terminal's lines): each ``phase_progress`` as a terminal shows it and each
    ``run_status``, as runtime lines at the event's wall time."""
    out = []
    for e in events:
        data, wall = e.get("data", {}), e.get("wall")
        if e["kind"] == "phase_progress":
            try:
                line = PhaseProgress(t=0.0, **data).line()
            except TypeError:  # checked on the way in (reporting._checked); never fail a batch
                line = f"{data.get('phase')} {data.get('done')}/{data.get('total')}"
            out.append({"time": wall, "source": "runtime", "level": "info", "text": line})
        elif e["kind"] == "run_status":
            text = f"run {data['status']} at step {data['step']}"
            text += f": {data['message']}" if data.get("message") else ""
            level = "error" if data["status"] == "failed" else "info"
            out.append({"time": wall, "source": "runtime", "level": level, "text": text})
    return out
