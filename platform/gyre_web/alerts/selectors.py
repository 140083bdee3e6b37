"""Webhook reads: those of the caller's teams."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from gyre_web.alerts.models import Delivery, Webhook
from gyre_web.teams.selectors import teams_of


def webhooks_visible(user: Any) -> QuerySet[Webhook]:
    return Webhook.objects.filter(team__in=teams_of(user)).order_by("-id")


def deliveries_of(webhook: Webhook, limit: int = 200) -> QuerySet[Delivery]:
    return webhook.deliveries.order_by("-id")[:limit]
