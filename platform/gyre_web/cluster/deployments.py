"""Which deployment a launch belongs to. Every launch message carries its deployment's key
(``Deployment``, one row per database); a worker takes only its own deployment's launches.
Two deployments whose workers share one broker (the same Redis database) would otherwise
take each other's launches and, finding no such run (or another run of that id), drop
them as done. Another deployment's launch is put back on the queue for its owner's
workers, logged as an error and recorded, and ``readyz`` reports the shared broker."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from gyre_web.cluster.models import Deployment

log = logging.getLogger(__name__)
# readyz reports a shared broker while a foreign launch was seen this recently.
REPORT_FOR = timedelta(hours=1)


def this_deployment() -> Deployment:
    row = Deployment.objects.order_by("pk").first()
    if row is None:  # the migration makes it; a flushed test database has none
        with transaction.atomic():
            row, _ = Deployment.objects.get_or_create(pk=1, defaults={"key": new_key()})
    return row


def new_key() -> str:
    return uuid.uuid4().hex


def deployment_key() -> str:
    """The key every launch message of this deployment carries."""
    return this_deployment().key


def foreign_launch(*, run_id: int, sender: str) -> str:
    """Why this deployment's worker must not take the launch of ``run_id`` sent by
    deployment ``sender`` ("" when it may: its own; a message without a key, from before
    keys, whose run is here). A foreign one is logged as an error and recorded."""
    from gyre_web.runs.models import Run

    me = this_deployment()
    if sender == me.key:
        return ""
    if not sender and Run.objects.filter(pk=run_id).exists():
        return ""
    why = (
        f"launch of run {run_id} belongs to deployment {sender}, not to this one ({me.key}):"
        " two deployments share this broker; give each its own Redis database"
        if sender
        else f"launch of run {run_id} carries no deployment and this database holds no such run"
    )
    log.error("%s", why)
    Deployment.objects.filter(pk=me.pk).update(
        other_key=sender or "?", other_run_id=run_id, other_seen_at=timezone.now()
    )
    return why


def shared_broker() -> dict[str, Any] | None:
    """The last foreign launch a worker of this deployment saw within REPORT_FOR, or None."""
    me = this_deployment()
    if me.other_seen_at is None or me.other_seen_at < timezone.now() - REPORT_FOR:
        return None
    return {
        "deployment": me.key,
        "other_deployment": me.other_key,
        "run": me.other_run_id,
        "seen_at": me.other_seen_at.isoformat(),
    }
