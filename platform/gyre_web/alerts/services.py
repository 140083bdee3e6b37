"""Webhook writes: register, remove, queue a delivery when a run ends, and deliver.

A delivery is queued in the transaction that ends the run (one per webhook and ending), so
a run never ends without its alerts queued; :func:`deliver_due` (every worker's watchdog
and beat) posts the JSON body, Slack-compatible (its ``text`` is the message Slack shows),
and retries a failed post with exponential backoff up to ``MAX_ATTEMPTS``, logging each
attempt's status or error on the delivery."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from gyre_web.alerts.models import ENDINGS, Delivery, Webhook

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
BACKOFF_S = 10.0  # the wait after the first failure; doubles after each
TIMEOUT_S = 5.0


def create_webhook(
    *, team: Any, url: str, events: list[str], name: str = "", created_by: Any = None
) -> Webhook:
    unknown = sorted(set(events) - set(ENDINGS))
    if unknown or not events:
        raise ValueError(f"events: a non-empty subset of {', '.join(ENDINGS)}")
    return Webhook.objects.create(
        team=team, url=url, events=sorted(set(events)), name=name, created_by=created_by
    )


def body(run: Any) -> dict[str, Any]:
    """The JSON posted for a run's ending: Slack's ``text``, and the run's fields."""
    name = run.name or f"run {run.pk}"
    exp = run.experiment
    text = f"Gyre: {name} ({exp.name}) {run.status} at step {run.step}/{run.steps}"
    if run.error:
        text += f": {run.error[:300]}"
    return {
        "text": text,
        "run": {
            "id": run.pk,
            "name": run.name,
            "status": run.status,
            "step": run.step,
            "steps": run.steps,
            "error": run.error,
            "experiment": exp.pk,
            "team": exp.team_id,
            "path": f"/runs/{run.pk}",
        },
    }


def queue_for(run: Any) -> int:
    """Queue a delivery to each of the run's team's webhooks that its ending calls ->
    how many (none twice for one ending)."""
    if run.status not in ENDINGS:
        return 0
    hooks = [
        h for h in Webhook.objects.filter(team_id=run.experiment.team_id) if run.status in h.events
    ]
    now, payload = timezone.now(), body(run)
    rows = [
        Delivery(webhook=h, run=run, event=run.status, body=payload, next_attempt_at=now)
        for h in hooks
    ]
    Delivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _post(url: str, payload: dict[str, Any]) -> int:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "gyre-alerts"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        return int(resp.status)


def deliver_due(*, limit: int = 50) -> int:
    """Post the deliveries that are due (each locked with skip_locked: concurrent callers
    take each once) -> how many were delivered now."""
    delivered = 0
    due = Delivery.objects.filter(state=Delivery.State.PENDING, next_attempt_at__lte=timezone.now())
    for pk in list(due.order_by("pk").values_list("pk", flat=True)[:limit]):
        with transaction.atomic():
            d = (
                Delivery.objects.select_for_update(skip_locked=True)
                .select_related("webhook")
                .filter(pk=pk, state=Delivery.State.PENDING)
                .first()
            )
            if d is None:
                continue
            d.attempts += 1
            try:
                d.last_status, d.last_error = _post(d.webhook.url, d.body), ""
            except urllib.error.HTTPError as err:
                d.last_status, d.last_error = err.code, f"HTTP {err.code}"
            except (urllib.error.URLError, OSError, ValueError) as err:
                d.last_status, d.last_error = None, str(err)[:500]
            if d.last_status is not None and 200 <= d.last_status < 300:
                d.state, d.delivered_at = Delivery.State.DELIVERED, timezone.now()
                delivered += 1
            elif d.attempts >= MAX_ATTEMPTS:
                d.state = Delivery.State.FAILED
                log.warning(
                    "webhook %s: run %s not delivered: %s", d.webhook_id, d.run_id, d.last_error
                )
            else:
                wait = BACKOFF_S * 2 ** (d.attempts - 1)
                d.next_attempt_at = timezone.now() + timedelta(seconds=wait)
            d.save()
    return delivered
