"""The run's event log: events appended with contiguous sequence numbers, the rows derived
from them (metric points folded into rollups, benchmark scores, the run's step), the
``run_status`` events the platform writes itself, and the wake-ups of the run's
websocket group."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gyre_web.realtime.groups import group_name
from gyre_web.runs import rollups
from gyre_web.runs.models import BenchmarkScore, MetricPoint, MetricRollup, Run, RunEvent
from gyre_web.wake import wake


def emit_status(*, run_id: int, status: str, step: int, message: str, t: float) -> None:
    """A ``run_status`` event written here (not by the run's sink), with its wake-up."""
    from gyre_core.events import RunStatus

    event = RunStatus(t=t, status=status, step=step, message=message)
    rows = append_events(run_id=run_id, events=[event.to_json()])
    last = rows[-1].seq
    transaction.on_commit(lambda: wake_subscribers(run_id, last))


def wake_subscribers(run_id: int, last_seq: int) -> None:
    """Tell the run's websocket group that events up to ``last_seq`` are stored."""
    wake_run(run_id=run_id, message={"type": "run.events", "run": run_id, "last_seq": last_seq})


def wake_run(*, run_id: int, message: dict[str, Any]) -> None:
    """Wake the run's websocket group (sent after a commit; subscribers read the table
    after their cursor, and also poll it)."""
    wake(group_name(run_id), message)


def _wall(value: Any) -> datetime:
    parsed = parse_datetime(value) if isinstance(value, str) else None
    return parsed or timezone.now()


def _stored_data(event: dict[str, Any]) -> Any:
    """What is stored (and so read by every reader) of an event's data: a step's payload
    file (``rollouts_written``) by its name, not its server folder; the caller imports the
    file from the event it holds (see gyre_web.redaction)."""
    data = event.get("data", {})
    if event.get("kind") == "rollouts_written" and isinstance(data, dict) and "path" in data:
        return {**data, "path": Path(str(data["path"])).name}
    return data


@transaction.atomic
def append_events(*, run_id: int, events: list[dict[str, Any]]) -> list[RunEvent]:
    """Append events (``Event.to_json`` dicts) with contiguous per-run sequence numbers,
    and derive metric points, benchmark scores and the run's step from them. A payload
    file's server path is not stored (``_stored_data``)."""
    if not events:
        return []
    run = Run.objects.select_for_update().only("id", "next_seq", "step").get(pk=run_id)
    first = run.next_seq
    rows = [
        RunEvent(
            run_id=run_id,
            seq=first + i,
            kind=str(e["kind"]),
            t=float(e.get("t", 0.0)),
            wall=_wall(e.get("wall")),
            data=_stored_data(e),
        )
        for i, e in enumerate(events)
    ]
    RunEvent.objects.bulk_create(rows)
    points, scores, step = [], [], run.step
    for e in events:
        data = e.get("data", {})
        if e["kind"] == "step_finished":
            step = max(step, int(data["step"]))
            metrics = data.get("metrics", {})
            # A NaN or infinite value arrives as null (events.storable): no point for it.
            points += [
                (str(k), int(data["step"]), float(v))
                for k, v in metrics.items()
                if isinstance(v, int | float)
            ]
        elif e["kind"] == "benchmark":
            scores.append(
                BenchmarkScore(
                    run_id=run_id,
                    step=int(data["step"]),
                    suite=str(data["suite"]),
                    score=float(data["score"]),
                    tasks=int(data.get("tasks", 0)),
                )
            )
    record_metric_points(run_id=run_id, points=points)
    BenchmarkScore.objects.bulk_create(scores, ignore_conflicts=True)
    Run.objects.filter(pk=run_id).update(
        next_seq=first + len(rows), step=step, heartbeat_at=timezone.now()
    )
    return rows


def record_metric_points(*, run_id: int, points: list[tuple[str, int, float]]) -> None:
    """Insert metric points (name, step, value) and fold them into the run's rollups. A
    resumed run may replay a step it had already reported: the first value stays. Call it
    with the run's row locked (``append_events`` does), so two writers never interleave."""
    first: dict[tuple[str, int], float] = {}
    for name, step, value in points:
        first.setdefault((name, step), value)
    if not first:
        return
    names = sorted({name for name, _ in first})
    stored = MetricPoint.objects.filter(
        run_id=run_id, name__in=names, step__in=sorted({step for _, step in first})
    ).values_list("name", "step")
    for key in stored:
        first.pop(key, None)
    fresh = [(name, step, value) for (name, step), value in first.items()]
    MetricPoint.objects.bulk_create(
        [MetricPoint(run_id=run_id, name=n, step=s, value=v) for n, s, v in fresh],
        ignore_conflicts=True,
    )
    _fold_rollups(run_id, names, rollups.blocks(fresh))


def _fold_rollups(run_id: int, names: list[str], new: dict[rollups.Key, rollups.Block]) -> None:
    if not new:
        return
    by_level: dict[int, set[int]] = {}
    for _, level, bucket in new:
        by_level.setdefault(level, set()).add(bucket)
    where = Q()
    for level, buckets in by_level.items():
        where |= Q(level=level, bucket__in=sorted(buckets))
    changed = []
    for row in MetricRollup.objects.filter(run_id=run_id, name__in=names).filter(where):
        block = new.pop((row.name, row.level, row.bucket), None)
        if block is None:
            continue
        merged = rollups.Block(row.min, row.max, row.last, row.first_step, row.last_step, row.count)
        merged.merge(block)
        for field, value in rollups.row_fields(merged).items():
            setattr(row, field, value)
        changed.append(row)
    MetricRollup.objects.bulk_update(changed, rollups.FIELDS)
    MetricRollup.objects.bulk_create(
        [
            MetricRollup(run_id=run_id, name=n, level=lv, bucket=bk, **rollups.row_fields(b))
            for (n, lv, bk), b in new.items()
        ]
    )


def rebuild_metric_rollups(*, run_ids: list[int] | None = None) -> int:
    """Recompute rollups from the stored points (for points written around
    ``record_metric_points``, e.g. by a bulk load); -> rollup rows written."""
    with transaction.atomic():
        if run_ids is not None:  # no sink batch folds in meanwhile (append_events locks it too)
            list(Run.objects.select_for_update().filter(pk__in=run_ids).values_list("pk"))
        return rollups.rebuild(MetricPoint, MetricRollup, run_ids)
