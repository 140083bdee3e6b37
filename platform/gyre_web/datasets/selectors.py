"""Dataset reads: those of the caller's teams, and the file a config's ``dataset:<id>``
names (for the config resolver and the workers; never shown in an answer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.models import QuerySet

from gyre_web.datasets.models import Dataset
from gyre_web.teams.selectors import teams_of


def datasets_visible(user: Any) -> QuerySet[Dataset]:
    return Dataset.objects.filter(team__in=teams_of(user)).order_by("-id")


def _of_team(team_id: int, dataset_id: int) -> Dataset:
    row = Dataset.objects.filter(pk=dataset_id, team_id=team_id).first()
    if row is None:
        raise LookupError(f"team {team_id} holds no dataset {dataset_id}")
    return row


def dataset_path(*, team_id: int, dataset_id: int) -> Path:
    """The stored file of the team's dataset; ``LookupError`` when the team holds none
    with that id (another team's dataset included)."""
    return _of_team(team_id, dataset_id).path


def dataset_kind(*, team_id: int, dataset_id: int) -> str:
    """``tasks`` or ``trajectories``; ``LookupError`` as ``dataset_path``."""
    return str(_of_team(team_id, dataset_id).kind)
