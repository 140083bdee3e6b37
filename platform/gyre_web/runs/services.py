"""Writes for experiments and runs: creation (config validated by gyre_core), the status
machine, cancel/pause/resume/fork, and the event log. Launches are sent on commit."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gyre_web.runs.models import (
    ACTIVE,
    TRANSITIONS,
    BenchmarkScore,
    Experiment,
    MetricPoint,
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
        name=name or f"{run.name or f'run {run.pk}'} (fork)",
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
            points += [
                MetricPoint(run_id=run_id, name=k, step=int(data["step"]), value=float(v))
                for k, v in data.get("metrics", {}).items()
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
    # A resumed run may replay a step it had already reported: keep the first value.
    MetricPoint.objects.bulk_create(points, ignore_conflicts=True)
    BenchmarkScore.objects.bulk_create(scores, ignore_conflicts=True)
    Run.objects.filter(pk=run_id).update(
        next_seq=first + len(rows), step=step, heartbeat_at=timezone.now()
    )
    return rows
