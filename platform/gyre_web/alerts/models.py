"""A team's webhooks, called when one of its runs ends, and the log of their deliveries."""

from __future__ import annotations

from django.conf import settings
from django.db import models

ENDINGS = ("succeeded", "failed", "cancelled")


class Webhook(models.Model):
    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100, blank=True)
    url = models.URLField(max_length=500)
    # the run endings that call it: a subset of ENDINGS
    events = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name or self.url


class Delivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # no attempt left

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=12)  # the run's ending
    body = models.JSONField()  # what is posted (kept as sent, for the log)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # the last attempt: "2xx".."5xx" (the answer's status class) or "failed", with a reason
    # class in last_error ("timeout", "refused address": gyre_web.alerts.net.REASONS); never
    # the target's own words or exact status
    last_result = models.CharField(max_length=8, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="delivery_due")]
        constraints = [
            models.UniqueConstraint(
                fields=["webhook", "run", "event"], name="one_delivery_per_ending"
            )
        ]
