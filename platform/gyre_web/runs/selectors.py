"""Reads for experiments and runs: what a user or share link may see, the event log after
a cursor, and metric series aligned by step and downsampled in the database."""

from __future__ import annotations

import math
from typing import Any

from django.db.models import F, Max, Min, Q, QuerySet

from gyre_web.runs.models import Experiment, MetricPoint, Run, RunEvent, Visibility
from gyre_web.teams.models import Membership


def _member_team_ids(user: Any) -> QuerySet[Membership, int]:
    return Membership.objects.filter(user=user).values_list("team_id", flat=True)


def experiments_visible(user: Any, link: Any = None) -> QuerySet[Experiment]:
    if link is not None:
        return Experiment.objects.filter(pk=link.experiment_id)  # none for a run link
    if not getattr(user, "is_authenticated", False):
        return Experiment.objects.none()
    return Experiment.objects.filter(
        Q(team_id__in=_member_team_ids(user)) | Q(visibility=Visibility.PUBLIC)
    )


def runs_visible(user: Any, link: Any = None) -> QuerySet[Run]:
    if link is not None:
        if link.run_id:
            return Run.objects.filter(pk=link.run_id)
        return Run.objects.filter(experiment_id=link.experiment_id)
    if not getattr(user, "is_authenticated", False):
        return Run.objects.none()
    return Run.objects.filter(
        Q(experiment__team_id__in=_member_team_ids(user))
        | Q(experiment__visibility=Visibility.PUBLIC)
    )


def events_after(*, run_id: int, after: int = 0, limit: int = 1000) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit])


def metric_names(*, run_ids: list[int]) -> list[str]:
    names = MetricPoint.objects.filter(run_id__in=run_ids).values_list("name", flat=True)
    return sorted(set(names.distinct()))


def metric_series(*, run_ids: list[int], names: list[str], points: int = 500) -> dict[str, Any]:
    """Series for each (run, name), bucketed on one shared step grid so runs align.

    Each bucket reports the min and max of its values and the value at its last step. The
    grouping runs in the database; only ``points`` rows per series come back.
    """
    if points < 1:
        raise ValueError("points must be at least 1")
    base = MetricPoint.objects.filter(run_id__in=run_ids, name__in=names)
    bounds = base.aggregate(lo=Min("step"), hi=Max("step"))
    if bounds["lo"] is None:
        return {"bucket": 1, "series": []}
    lo, hi = int(bounds["lo"]), int(bounds["hi"])
    width = max(1, math.ceil((hi - lo + 1) / points))
    rows = (
        base.annotate(bucket=(F("step") - lo) / width)
        .values("run_id", "name", "bucket")
        .annotate(lo=Min("value"), hi=Max("value"), last_step=Max("step"))
        .order_by("run_id", "name", "bucket")
    )
    rows = list(rows)
    last_values: dict[tuple[int, str, int], float] = {}
    wanted = {(r["run_id"], r["name"], r["last_step"]) for r in rows}
    steps = {step for _, _, step in wanted}
    for run_id, name, step, value in base.filter(step__in=steps).values_list(
        "run_id", "name", "step", "value"
    ):
        if (run_id, name, step) in wanted:
            last_values[(run_id, name, step)] = value
    series: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["run_id"], r["name"]), []).append(
            {
                "step": lo + int(r["bucket"]) * width,  # the bucket's first step: aligned
                "last_step": r["last_step"],
                "min": r["lo"],
                "max": r["hi"],
                "last": last_values[(r["run_id"], r["name"], r["last_step"])],
            }
        )
    return {
        "bucket": width,
        "series": [
            {"run": run_id, "name": name, "points": pts}
            for (run_id, name), pts in sorted(series.items())
        ],
    }
