"""Writes for experiments and runs: creation (config validated by gyre_core), the status
machine, cancel/pause/resume/fork, and the event log. Launches go through an outbox (sent
on commit, retried by ``dispatch_launches``); ``claim_launch``, ``heartbeat_launch`` and
``reap_stale_runs`` are the worker's side of the status machine."""

from __future__ import annotations

import copy
import logging
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gyre_web.runs import config_policy, rollups
from gyre_web.runs.config_policy import ConfigInvalid
from gyre_web.runs.exports import claim_export, finish_export  # checkpoint exports
from gyre_web.runs.logs import append_log_lines, level_name  # the run log's writes
from gyre_web.runs.models import (
    ACTIVE,
    TRANSITIONS,
    BenchmarkScore,
    Experiment,
    LaunchOutbox,
    MetricPoint,
    MetricRollup,
    Run,
    RunEvent,
    Source,
    Status,
)
from gyre_web.wake import wake

log = logging.getLogger(__name__)
# with the functions below (no star import): what the workers use of logs and exports
__all__ = ["ConfigInvalid", "append_log_lines", "claim_export", "finish_export", "level_name"]
# A send while the broker is down fails after about a second, not kombu's default retries.
SEND_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}
WORKING = (Status.STARTING, Status.RUNNING)  # a worker holds the run (and heartbeats)


class IllegalTransition(ValueError):
    pass


def validate_config(
    config: Any, *, runs_here: bool = True, team_id: int | None = None, user: Any = None
) -> Any:
    """-> gyre_core RunConfig, or ConfigInvalid listing every bad field. ``runs_here``:
    the platform's workers would run it, so what it may name is the operator's rule
    (``config_policy``) for a run of team ``team_id`` launched by ``user``; a reported run
    runs elsewhere, its plugins, paths and agents are its reporter's business."""
    from gyre_core.config import ConfigError, RunConfig

    if not isinstance(config, dict):
        raise ConfigInvalid([("config", "must be an object")])
    try:
        cfg = RunConfig.from_dict(config)
    except ConfigError as err:
        raise ConfigInvalid(list(err.errors) or [("config", str(err))]) from None
    if runs_here:
        config_policy.enforce(cfg, team_id=team_id, user=user)  # the stored config keeps its names
    return cfg


def runnable_config(run: Run) -> Any:
    """The config a worker executes for ``run``: decided again under the worker's own
    settings (``config_policy.runnable``; raises ConfigInvalid or gyre_core's ConfigError)."""
    return config_policy.runnable(run)


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
    *,
    team: Any,
    name: str,
    created_by: Any = None,
    description: str = "",
    tags: list[str] | None = None,
    visibility: str = "team",
) -> Experiment:
    return Experiment.objects.create(
        team=team,
        name=name,
        description=description,
        tags=list(tags or []),
        visibility=visibility,
        created_by=created_by,
    )


def _send_launch(run: Run) -> None:
    """Queue ``launch_run`` through the outbox: its row commits with the run, the send is
    tried on commit, and ``dispatch_launches`` retries it until it is sent."""
    task_id = str(uuid.uuid4())
    Run.objects.filter(pk=run.pk).update(celery_task_id=task_id)
    run.celery_task_id = task_id
    row = LaunchOutbox.objects.create(run=run, task_id=task_id)
    transaction.on_commit(lambda: send_launch(row))


def queue_launch(run: Run) -> None:
    """Launch a queued run that was created with ``launch=False`` (a sweep's run, once a
    slot under its cap is free), through the outbox, in the caller's transaction."""
    _send_launch(run)


def send_launch(row: LaunchOutbox) -> bool:
    """Send one outbox row's message (dispatch only). A broker error is logged and kept on
    the row for the dispatcher to retry, never raised. -> whether it was sent."""
    from gyre_web.cluster.deployments import deployment_key
    from workers.celery_app import app

    now = timezone.now()
    done = LaunchOutbox.objects.filter(pk=row.pk)
    try:
        app.send_task(
            "workers.tasks.launch_run",
            args=[row.run_id],
            kwargs={"deployment": deployment_key()},  # only this deployment's workers take it
            task_id=row.task_id,
            retry_policy=SEND_RETRY,
        )
    except Exception as err:  # the broker is unreachable: the dispatcher sends it later
        log.warning("launch of run %s not sent yet: %s", row.run_id, err)
        done.update(attempts=F("attempts") + 1, attempted_at=now, last_error=str(err)[:500])
        return False
    done.update(attempts=F("attempts") + 1, attempted_at=now, sent_at=now, last_error="")
    return True


def send_task(name: str, args: list[Any], task_id: str) -> None:
    """Send a Celery task by name (dispatch only: the platform imports no worker code);
    a broker error raises after about a second."""
    from workers.celery_app import app

    app.send_task(name, args=args, task_id=task_id, retry_policy=SEND_RETRY)


def dispatch_launches(*, limit: int = 100) -> int:
    """Send the launches that are due: unsent ones last tried GYRE_OUTBOX_RETRY_SECONDS
    ago, and sent ones whose run is still queued GYRE_LAUNCH_RESEND_SECONDS after (the
    broker may have lost them). Only a run's current launch counts. Rows stay locked
    (skip_locked) while they are sent, so concurrent dispatchers never send one row at
    once; a message that still arrives twice launches the run once (``claim_launch``).
    Stops at the first failure: the broker is down. -> messages sent."""
    now = timezone.now()
    retry = now - timedelta(seconds=settings.GYRE_OUTBOX_RETRY_SECONDS)
    resend = now - timedelta(seconds=settings.GYRE_LAUNCH_RESEND_SECONDS)
    unsent = Q(sent_at__isnull=True) & (
        Q(attempted_at__isnull=True, created_at__lt=retry) | Q(attempted_at__lt=retry)
    )
    due = LaunchOutbox.objects.filter(
        unsent | Q(sent_at__lt=resend), run__status=Status.QUEUED, run__celery_task_id=F("task_id")
    )
    sent = 0
    with transaction.atomic():
        for row in due.select_for_update(skip_locked=True, of=("self",)).order_by("pk")[:limit]:
            if not send_launch(row):
                break
            sent += 1
    return sent


@transaction.atomic
def create_run(
    *,
    experiment: Experiment,
    config: dict[str, Any],
    created_by: Any = None,
    name: str = "",
    parent: Run | None = None,
    launch: bool = True,
    source: str = Source.LAUNCHED,
) -> Run:
    cfg = validate_config(
        config, runs_here=source == Source.LAUNCHED, team_id=experiment.team_id, user=created_by
    )
    run = Run.objects.create(
        source=source,
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
    if to in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
        from gyre_web.alerts.services import queue_for

        queue_for(run)  # in this transaction: a run never ends without its alerts queued
    if to not in ACTIVE:
        from gyre_web.sweeps.services import run_left_active

        run_left_active(run)  # in this transaction: its sweep's next run takes the slot
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
    if _worker_gone(run):  # nobody would read the request: stop it here and now
        final = Status.CANCELLED if mode == "cancel" else Status.PAUSED
        return _end_lost(run, final, f"{final} at step {run.step}: its worker is gone")
    run.stop_requested = mode
    run.save(update_fields=["stop_requested"])
    return run


@transaction.atomic
def resume_run(*, run: Run, user: Any = None) -> Run:
    """The same run continues from its last checkpoint (queued again, launched on commit);
    its config is checked again for ``user`` under today's settings (ConfigInvalid)."""
    if run.source == Source.REPORTED:
        raise IllegalTransition(
            f"run {run.pk} reports from elsewhere: resume it there (gyre run --resume)"
        )
    validate_config(run.config, team_id=run.experiment.team_id, user=user)
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


def claim_launch(*, run_id: int, task_id: str) -> tuple[Run, bool] | None:
    """Take the run for this delivery of its launch: (run, continuing) or None when there
    is nothing to do. Under the run's row lock, so of two deliveries of one message (the
    outbox sends at least once) exactly one launches the run."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return None
        if run.celery_task_id and run.celery_task_id != task_id:
            return None  # a stale or duplicate message: another launch owns this run
        if run.status == Status.QUEUED:
            resume = run.resume_requested
            run = transition(
                run_id, Status.STARTING, celery_task_id=task_id, resume_requested=False
            )
            return run, resume
        if run.status in WORKING:
            # Redelivered (a worker died, or a visibility timeout ran out under a live
            # one): take over only from a worker that went quiet. A fresh heartbeat means
            # a live worker holds the run; should it die, the reaper resumes the run once
            # its heartbeat is stale, so skipping this message loses nothing.
            quiet = timezone.now() - timedelta(seconds=settings.GYRE_TAKEOVER_SECONDS)
            if run.heartbeat_at is not None and run.heartbeat_at > quiet:
                return None
            if run.stop_requested:  # asked to stop while its worker died: stop, do not run
                final = Status.CANCELLED if run.stop_requested == "cancel" else Status.PAUSED
                _end_lost(run, final, f"{final} at step {run.step}: its worker went quiet")
                return None
            run.heartbeat_at = timezone.now()  # ours now: the reaper leaves it alone
            run.save(update_fields=["heartbeat_at"])
            return run, True  # continue from the checkpoint
        return None


def heartbeat_launch(*, run_id: int, task_id: str) -> bool:
    """The worker executing launch ``task_id`` is alive (its watchdog thread calls this
    every GYRE_HEARTBEAT_SECONDS). -> False once the run is no longer this launch's."""
    return bool(
        Run.objects.filter(pk=run_id, celery_task_id=task_id, status__in=WORKING).update(
            heartbeat_at=timezone.now()
        )
    )


def run_dir(run_id: int) -> Path:
    return Path(settings.GYRE_RUNS_DIR) / str(run_id)


def can_resume(run: Run) -> bool:
    """A simulated run replays deterministically from its config; a real one needs a
    checkpoint in its working directory."""
    if run.backend == "sim":
        return True
    ckpt = run_dir(run.pk) / "checkpoints"
    return ckpt.is_dir() and any(ckpt.iterdir())


def _worker_gone(run: Run) -> bool:
    if run.status not in WORKING:
        return False
    limit = timezone.now() - timedelta(seconds=settings.GYRE_HEARTBEAT_TIMEOUT_SECONDS)
    return run.heartbeat_at is None or run.heartbeat_at < limit


def reap_stale_runs(*, limit: int = 50) -> list[int]:
    """Runs whose worker stopped heartbeating (GYRE_HEARTBEAT_TIMEOUT_SECONDS): cancelled
    (or paused) when a stop was asked and not yet read, else queued again to resume from
    their checkpoint (a new launch through the outbox) when they can, else failed with the
    reason; each gets a ``run_status`` event. Each run is
    locked with skip_locked, so concurrent reapers (every worker runs one) take each
    stale run once. -> the ids reaped."""
    limit_at = timezone.now() - timedelta(seconds=settings.GYRE_HEARTBEAT_TIMEOUT_SECONDS)
    # a reported run is never reaped: its reporter may be buffering on its own disk while
    # the platform is unreachable, and catches up when it comes back
    stale = (
        Q(status__in=WORKING)
        & ~Q(source=Source.REPORTED)
        & (Q(heartbeat_at__lt=limit_at) | Q(heartbeat_at__isnull=True))
    )
    reaped = []
    for run_id in list(
        Run.objects.filter(stale).order_by("pk").values_list("pk", flat=True)[:limit]
    ):
        with transaction.atomic():
            run = Run.objects.select_for_update(skip_locked=True).filter(stale, pk=run_id).first()
            if run is None:
                continue  # another reaper has it, or it heartbeated or finished meanwhile
            resumes = RunEvent.objects.filter(
                run_id=run_id, kind="run_status", data__status=Status.QUEUED
            ).count()
            lost = f"the worker stopped heartbeating at step {run.step}"
            if run.stop_requested:  # asked to stop while its worker died: stop it now
                final = Status.CANCELLED if run.stop_requested == "cancel" else Status.PAUSED
                _end_lost(run, final, f"{final} at step {run.step}: {lost}")
            elif not can_resume(run):
                _end_lost(run, Status.FAILED, f"{lost}; no checkpoint to resume from")
            elif resumes >= settings.GYRE_REAPER_MAX_RESUMES:
                _end_lost(run, Status.FAILED, f"{lost}; resumed {resumes} times already")
            else:
                _end_lost(run, Status.QUEUED, f"{lost}; resuming from its checkpoint")
            reaped.append(run_id)
    return reaped


def _end_lost(run: Run, status: str, message: str) -> Run:
    """A run whose worker is gone: GPUs released, role intervals closed, moved to
    ``status`` (queued: relaunched with resume) and a ``run_status`` event saying why."""
    from gyre_web.cluster.services import close_role_intervals, release_gpus

    with transaction.atomic():
        t = RunEvent.objects.filter(run_id=run.pk).order_by("-seq").values_list("t", flat=True)
        last_t = t.first() or 0.0
        close_role_intervals(run_id=run.pk, t=last_t)
        release_gpus(run_id=run.pk)
        fields: dict[str, Any] = {"error": message} if status == Status.FAILED else {}
        if status == Status.QUEUED:
            fields["resume_requested"] = True
        run = transition(run.pk, status, **fields)
        if status == Status.QUEUED:
            _send_launch(run)
        log.warning("run %s: %s", run.pk, message)
        emit_status(run_id=run.pk, status=status, step=run.step, message=message, t=last_t)
    return run


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
    from gyre_web.runs.consumers import group_name

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
