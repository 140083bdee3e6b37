"""Sweeps: runs of one experiment launched from one base config with some config fields
varied (a grid, or random samples), at most ``max_concurrent`` of them started at once."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Mode(models.TextChoices):
    GRID = "grid"
    RANDOM = "random"


class Sweep(models.Model):
    experiment = models.ForeignKey(
        "runs.Experiment", on_delete=models.CASCADE, related_name="sweeps"
    )
    name = models.CharField(max_length=200, blank=True)
    base_config = models.JSONField()  # as sent; each run keeps its own validated snapshot
    mode = models.CharField(max_length=8, choices=Mode.choices)
    # grid: field path -> list of values; random: field path -> list of choices or
    # {"low", "high", "log"?, "int"?}
    params = models.JSONField()
    samples = models.IntegerField(default=0)  # random only
    seed = models.BigIntegerField(default=0)  # random only
    max_concurrent = models.IntegerField()
    cancelled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name or f"sweep {self.pk}"


class SweepRun(models.Model):
    """One run of a sweep: its place in the sweep and the values of the swept fields. The
    run is launched (has a launch in the outbox) once a slot under the cap is free."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="sweep_runs")
    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="sweep_run")
    index = models.IntegerField()
    values = models.JSONField()  # field path -> value

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["sweep", "index"], name="one_run_per_sweep_index")
        ]
