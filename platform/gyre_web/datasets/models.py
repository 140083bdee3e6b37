"""A team's uploaded data files: task lists (``rollout.tasks``) and trajectories or message
logs (``warm_start.data``, ``train.offpolicy_data``), named in configs by id.

The file lives under ``GYRE_DATA_DIR/datasets/<team>/`` with a name the server chose
(``file_name``); the client's file name is never part of a path, and no answer shows one.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import models


class Kind(models.TextChoices):
    TASKS = "tasks"  # rollout.tasks: JSONL objects or Parquet rows
    TRAJECTORIES = "trajectories"  # gyre.trajectory/v1 or an OpenAI message log (JSONL)


class Format(models.TextChoices):
    JSONL = "jsonl"
    PARQUET = "parquet"
    TRAJECTORY = "trajectory"  # gyre.trajectory/v1
    CHAT_LOG = "chat_log"  # OpenAI message log


def team_folder(team_id: int) -> Path:
    return Path(settings.GYRE_DATA_DIR) / "datasets" / str(int(team_id))


class Dataset(models.Model):
    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    format = models.CharField(max_length=10, choices=Format.choices)
    # server-chosen: "<32 hex>.jsonl" or "<32 hex>.parquet" inside the team's folder
    file_name = models.CharField(max_length=64, unique=True)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    rows = models.BigIntegerField()  # tasks, rollouts or conversations
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["team", "-id"], name="dataset_team_newest")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def path(self) -> Path:
        return team_folder(self.team_id) / self.file_name
