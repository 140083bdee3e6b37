"""Webhook writes: register, remove, queue a delivery when a run ends, and deliver.

A delivery is queued in the transaction that ends the run (one per webhook and ending), so
a run never ends without its alerts queued; :func:`deliver_due` (each worker's webhook
thread, and beat) posts the JSON body, Slack-compatible (its ``text`` is the message
Slack shows), a few at once, and retries a failed post with exponential backoff up to
``MAX_ATTEMPTS``, logging each attempt's status class or failure reason on the delivery
(``gyre_web.alerts.net`` checks the address and makes the post)."""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from gyre_web.alerts import net
from gyre_web.alerts.models import ENDINGS, Delivery, Webhook

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
BACKOFF_S = 10.0  # the wait after the first failure; doubles after each
CLAIM_BATCH = 50  # due deliveries considered for each claim
LEASE_SLACK_S = 60.0  # a claimed delivery is due again this long after its attempt's bound


def create_webhook(
    *, team: Any, url: str, events: list[str], name: str = "", created_by: Any = None
) -> Webhook:
    unknown = sorted(set(events) - set(ENDINGS))
    if unknown or not events:
        raise ValueError(f"events: a non-empty subset of {', '.join(ENDINGS)}")
    net.check(url)  # net.Refused (a ValueError) names what is wrong with the URL
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


def _claim_next(busy: set[int] | frozenset[int] = frozenset()) -> Delivery | None:
    """Take one due delivery: first of a team with no post in flight here (``busy``: team
    ids), so one team's slow webhooks leave the other slots to the other teams; then the
    fewest attempts, then the oldest. Its attempt is counted and it is put out of reach (due
    again only after a lease longer than an attempt, should this process die meanwhile)
    by a compare-and-set update, so concurrent deliverers never post one twice."""
    due = Delivery.objects.filter(state=Delivery.State.PENDING)
    while True:
        now = timezone.now()
        rows = list(
            due.filter(next_attempt_at__lte=now)
            .select_related("webhook")
            .order_by("attempts", "next_attempt_at", "pk")[:CLAIM_BATCH]
        )
        if not rows:
            return None
        rows.sort(key=lambda d: d.webhook.team_id in busy)  # stable: the order above within
        lease = now + timedelta(seconds=settings.GYRE_WEBHOOK_TIMEOUT_SECONDS + LEASE_SLACK_S)
        for d in rows:
            won = due.filter(
                pk=d.pk, attempts=d.attempts, next_attempt_at=d.next_attempt_at
            ).update(attempts=d.attempts + 1, next_attempt_at=lease)
            if won:
                d.attempts, d.next_attempt_at = d.attempts + 1, lease
                return d


def _record(d: Delivery, result: str, reason: str) -> bool:
    """Write one attempt's outcome on its delivery -> whether it was delivered."""
    now = timezone.now()
    fields: dict[str, Any] = {"last_result": result, "last_error": reason}
    delivered = result == "2xx"
    if delivered:
        fields.update(state=Delivery.State.DELIVERED, delivered_at=now)
    elif d.attempts >= MAX_ATTEMPTS:
        fields["state"] = Delivery.State.FAILED
        log.warning(
            "webhook %s: run %s not delivered: %s %s", d.webhook_id, d.run_id, result, reason
        )
    else:
        fields["next_attempt_at"] = now + timedelta(seconds=BACKOFF_S * 2 ** (d.attempts - 1))
    Delivery.objects.filter(pk=d.pk, attempts=d.attempts).update(**fields)
    return delivered


def _attempt(url: str, payload: dict[str, Any]) -> tuple[str, str]:
    return net.post(url, payload, timeout=settings.GYRE_WEBHOOK_TIMEOUT_SECONDS)


def deliver_due(*, limit: int = 200) -> int:
    """Post the deliveries that are due, at most GYRE_WEBHOOK_WORKERS at once (each
    claimed just before its post, another team's first: concurrent callers take each
    once), until none is due
    or ``limit`` were taken -> how many were delivered now. The database is used from the
    calling thread only; the pool's threads only post. A failure of any kind is recorded
    on its delivery and the others go on."""
    delivered = taken = 0
    workers = int(settings.GYRE_WEBHOOK_WORKERS)
    running: dict[Future[tuple[str, str]], Delivery] = {}
    with ThreadPoolExecutor(workers, thread_name_prefix="gyre-webhook") as pool:
        while True:
            while len(running) < workers and taken < limit:
                d = _claim_next({x.webhook.team_id for x in running.values()})
                if d is None:
                    break
                taken += 1
                running[pool.submit(_attempt, d.webhook.url, d.body)] = d
            if not running:
                return delivered
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                d = running.pop(future)
                try:
                    result, reason = future.result()
                except Exception:
                    result, reason = "failed", "error"
                delivered += _record(d, result, reason)
