"""Launches through an outbox: a ``LaunchOutbox`` row commits with its run, its message
(``workers.tasks.launch_run``, sent by name through ``gyre_web.queue``) is sent on commit,
and ``dispatch_launches`` retries what is unsent or lost until the run is claimed."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from gyre_web import queue
from gyre_web.runs.models import LaunchOutbox, Run, Status

log = logging.getLogger(__name__)
LAUNCH = "workers.tasks.launch_run"


def queue_launch(run: Run) -> None:
    """Launch a queued run through the outbox, in the caller's transaction (a new run, a
    resumed one, or one created with ``launch=False``: a sweep's run, once a slot under
    its cap is free): its row commits with the run, the send is tried on commit, and
    ``dispatch_launches`` retries it until it is sent."""

    task_id = str(uuid.uuid4())
    Run.objects.filter(pk=run.pk).update(celery_task_id=task_id)
    run.celery_task_id = task_id
    row = LaunchOutbox.objects.create(run=run, task_id=task_id)
    transaction.on_commit(lambda: send_launch(row))


def send_launch(row: LaunchOutbox) -> bool:
    """Send one outbox row's message (dispatch only). A broker error is logged and kept on
    the row for the dispatcher to retry, never raised. -> whether it was sent."""
    from gyre_web.cluster.deployments import deployment_key

    now = timezone.now()
    done = LaunchOutbox.objects.filter(pk=row.pk)
    try:
        queue.send_task(
            LAUNCH,
            args=[row.run_id],
            kwargs={"deployment": deployment_key()},  # only this deployment's workers take it
            task_id=row.task_id,
        )
    except Exception as err:  # the broker is unreachable: the dispatcher sends it later
        log.warning("launch of run %s not sent yet: %s", row.run_id, err)
        done.update(attempts=F("attempts") + 1, attempted_at=now, last_error=str(err)[:500])
        return False
    done.update(attempts=F("attempts") + 1, attempted_at=now, sent_at=now, last_error="")
    return True


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
