"""Which deployment this is. Every launch message carries its deployment's key
(``Deployment``, one row per database); a worker takes only its own deployment's launches
(``cluster.services.foreign_launch``). Two deployments whose workers share one broker (the
same Redis database) would otherwise take each other's launches and, finding no such run
(or another run of that id), drop them as done. Another deployment's launch is put back
on the queue for its owner's workers, logged as an error and recorded; ``shared_broker``
is what ``readyz`` and ``/metrics`` report."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from gyre_web.cluster.models import Deployment

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
