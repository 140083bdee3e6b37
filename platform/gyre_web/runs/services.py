"""Writes for experiments and runs: creation (config validated by gyre_core), the status
machine, cancel/pause/resume/fork, and the event log. Launches are sent on commit."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gyre_web.runs import rollups
from gyre_web.runs.models import (
    ACTIVE,
    TRANSITIONS,
    BenchmarkScore,
    Experiment,
    MetricPoint,
    MetricRollup,
    Run,
    RunEvent,
    Status,
)


class IllegalTransition(ValueError):
    pass


class ConfigInvalid(ValueError):
    """The run config failed gyre_core validation; ``errors`` = [(field path, message)]."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in errors))
        self.errors = errors


def validate_config(config: Any) -> Any:
    """-> gyre_core RunConfig, or ConfigInvalid listing every bad field."""
    from gyre_core.config import ConfigError, RunConfig

    if not isinstance(config, dict):
        raise ConfigInvalid([("config", "must be an object")])
    try:
        return RunConfig.from_dict(config)
    except ConfigError as err:
        raise ConfigInvalid(list(err.errors) or [("config", str(err))]) from None


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@transaction.atomic
def create_experiment(
    *, team: Any, name: str, created_by: Any = None, description: str = "",
    tags: list[str] | None = None, visibility: str = "team",
) -> Experiment:  # fmt: skip
    return Experiment.objects.create(
        team=team,
        name=name,
        description=description,
        tags=list(tags or []),
        visibility=visibility,
        created_by=created_by,
    )


def _send_launch(run: Run) -> None:
    """Queue launch_run once the surrounding transaction commits (dispatch only)."""
    task_id = str(uuid.uuid4())
    Run.objects.filter(pk=run.pk).update(celery_task_id=task_id)
    run.celery_task_id = task_id
    run_id = run.pk

    def send() -> None:
        from workers.celery_app import app

        app.send_task("workers.tasks.launch_run", args=[run_id], task_id=task_id)

    transaction.on_commit(send)


@transaction.atomic
def create_run(
    *, experiment: Experiment, config: dict[str, Any], created_by: Any = None, name: str = "",
    parent: Run | None = None, launch: bool = True,
) -> Run:  # fmt: skip
    cfg = validate_config(config)
    run = Run.objects.create(
        experiment=experiment,
        name=name,
        config=cfg.to_dict(),
        policy=cfg.policy,
        backend=cfg.backend,
        seed=cfg.seed,
        steps=cfg.steps,
        parent=parent,
        created_by=created_by,
    )
    if launch:
        _send_launch(run)
    return run


@transaction.atomic
def transition(run_id: int, to: str, **fields: Any) -> Run:
    """Move a run to status ``to``; raises IllegalTransition if the machine forbids it."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if to not in TRANSITIONS.get(run.status, frozenset()):
        raise IllegalTransition(f"run {run_id} cannot go from {run.status} to {to}")
    now = timezone.now()
    run.status = to
    if to == Status.STARTING:
        run.started_at = now
        run.heartbeat_at = now
    if to in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PAUSED):
        run.finished_at = now
        run.stop_requested = ""
    if to == Status.QUEUED:
        run.finished_at = None
        run.error = ""
    for key, value in fields.items():
        setattr(run, key, value)
    run.save()
    return run


@transaction.atomic
def request_stop(*, run: Run, mode: str = "cancel") -> Run:
    """Cancel (or pause) a run: a queued run stops at once, an active one at its next poll."""
    if mode not in ("cancel", "pause"):
        raise ValueError(f"unknown stop mode {mode!r}")
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status == Status.QUEUED or (run.status == Status.PAUSED and mode == "cancel"):
        return transition(run.pk, Status.CANCELLED)
    if run.status not in ACTIVE:
        raise IllegalTransition(f"run {run.pk} is {run.status}; only an active run can stop")
    run.stop_requested = mode
    run.save(update_fields=["stop_requested"])
    return run


@transaction.atomic
def resume_run(*, run: Run) -> Run:
    """The same run continues from its last checkpoint (queued again, launched on commit)."""
    run = transition(run.pk, Status.QUEUED, resume_requested=True)
    _send_launch(run)
    return run


@transaction.atomic
def fork_run(*, run: Run, changes: dict[str, Any], created_by: Any = None, name: str = "") -> Run:
    """A new run from a copy of ``run``'s config with ``changes`` merged in, parent linked."""
    config = deep_merge(run.config, changes)
    return create_run(
        experiment=run.experiment,
        config=config,
        created_by=created_by,
        name=(name or f"{run.name or f'run {run.pk}'} (fork)")[:200],  # Run.name's max_length
        parent=run,
    )


def heartbeat(*, run_id: int, step: int | None = None, checkpoint_path: str = "") -> None:
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if step is not None:
        fields["step"] = step
    if checkpoint_path:
        fields["checkpoint_path"] = checkpoint_path
    Run.objects.filter(pk=run_id).update(**fields)


def _wall(value: Any) -> datetime:
    parsed = parse_datetime(value) if isinstance(value, str) else None
    return parsed or timezone.now()


@transaction.atomic
def append_events(*, run_id: int, events: list[dict[str, Any]]) -> list[RunEvent]:
    """Append events (``Event.to_json`` dicts) with contiguous per-run sequence numbers,
    and derive metric points, benchmark scores and the run's step from them."""
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
            data=e.get("data", {}),
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
        merged = rollups.Block(row.min, row.max, row.last, row.first_step, row.last_step,
                               row.count)  # fmt: skip
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
