"""The run's status machine and the worker's side of it: ``transition`` (with the
``hooks`` other apps register for a run's end), stop (cancel or pause), resume, and a
worker's lease on its run: ``claim_launch``, heartbeats, and ``reap_stale_runs`` for runs
whose worker went quiet."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from gyre_web.runs import hooks
from gyre_web.runs.eventlog import emit_status
from gyre_web.runs.experiments import validate_config
from gyre_web.runs.launch import queue_launch
from gyre_web.runs.models import ACTIVE, TRANSITIONS, Run, RunEvent, Source, Status
from gyre_web.runs.paths import run_dir

log = logging.getLogger(__name__)
WORKING = (Status.STARTING, Status.RUNNING)  # a worker holds the run (and heartbeats)


class IllegalTransition(ValueError):
    pass


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
        hooks.run_ended(run)  # in this transaction: e.g. a run never ends without its alerts
    if to not in ACTIVE:
        hooks.run_left_active(run)  # in this transaction: e.g. its sweep's next run starts
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
    queue_launch(run)
    return run


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
            queue_launch(run)
        log.warning("run %s: %s", run.pk, message)
        emit_status(run_id=run.pk, status=status, step=run.step, message=message, t=last_t)
    return run
