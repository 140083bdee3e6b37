"""Reads for experiments and runs: what a user or share link may see, the event log after
a cursor, and metric series aligned by step and downsampled in the database."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Max, Min, Q, QuerySet

from gyre_web.runs import rollups
from gyre_web.runs.models import (
    Experiment,
    MetricPoint,
    MetricRollup,
    Run,
    RunEvent,
    Visibility,
)
from gyre_web.teams.models import WRITE_ROLES, Membership


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


def experiments_writable(user: Any) -> QuerySet[Experiment, int]:
    """Ids of the experiments whose runs ``user`` may control (a writer in the team)."""
    if not getattr(user, "is_authenticated", False):
        return Experiment.objects.none().values_list("pk", flat=True)
    teams = Membership.objects.filter(user=user, role__in=WRITE_ROLES).values_list("team_id")
    return Experiment.objects.filter(team_id__in=teams).values_list("pk", flat=True)


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


def events_after(
    *, run_id: int, after: int = 0, limit: int = 1000, kinds: list[str] | None = None
) -> list[RunEvent]:
    """Events after the cursor ``after`` in ``seq`` order; only those of ``kinds`` if given."""
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after)
    if kinds:
        rows = rows.filter(kind__in=kinds)
    return list(rows.order_by("seq")[:limit])


def metric_names(*, run_ids: list[int]) -> list[str]:
    top = MetricRollup.objects.filter(run_id__in=run_ids, level=rollups.LEVELS)
    names = top.values_list("name", flat=True).distinct()
    if not names:  # points without rollups (written around the services)
        names = MetricPoint.objects.filter(run_id__in=run_ids).values_list("name", flat=True)
    return sorted(set(names.distinct()))


def metric_series(*, run_ids: list[int], names: list[str], points: int = 500) -> dict[str, Any]:
    """Series for each (run, name), bucketed on one shared step grid so runs align.

    Each bucket reports the min and max of its values and the value at its last step. The
    grouping runs in the database over the rollup blocks (``rollups.grid`` picks the level
    and says how the grid snaps to it) or, for a short span, over the points themselves;
    only ``points`` rows per series come back.
    """
    if points < 1:
        raise ValueError("points must be at least 1")
    top = MetricRollup.objects.filter(run_id__in=run_ids, name__in=names, level=rollups.LEVELS)
    bounds = top.aggregate(lo=Min("first_step"), hi=Max("last_step"))
    has_rollups = bounds["lo"] is not None
    if not has_rollups:  # points without rollups (written around the services)
        raw = MetricPoint.objects.filter(run_id__in=run_ids, name__in=names)
        bounds = raw.aggregate(lo=Min("step"), hi=Max("step"))
    if bounds["lo"] is None:
        return {"bucket": 1, "series": []}
    lo, hi = int(bounds["lo"]), int(bounds["hi"])
    grid = rollups.grid(lo, hi, points) if has_rollups else rollups.plain_grid(lo, hi, points)
    if grid.level == 0:
        base: QuerySet[Any] = MetricPoint.objects.filter(run_id__in=run_ids, name__in=names)
        start: Any = F("step")
        fields = ("value", "value", "step", "value")
    else:
        base = MetricRollup.objects.filter(run_id__in=run_ids, name__in=names, level=grid.level)
        start = F("bucket") * (1 << grid.level)
        fields = ("min", "max", "last_step", "last")
    low, high, step, value = fields
    rows = list(
        base.annotate(b=(start - grid.origin) / grid.width)
        .values("run_id", "name", "b")
        .annotate(lo=Min(low), hi=Max(high), last_step=Max(step))
        .order_by("run_id", "name", "b")
    )
    wanted = {(r["run_id"], r["name"], r["last_step"]) for r in rows}
    last_values: dict[tuple[int, str, int], float] = {}
    lasts = base.filter(**{f"{step}__in": sorted({s for _, _, s in wanted})})
    for run_id, name, at, v in lasts.values_list("run_id", "name", step, value):
        if (run_id, name, at) in wanted:
            last_values[(run_id, name, at)] = v
    series: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["run_id"], r["name"]), []).append(
            {
                "step": grid.origin + int(r["b"]) * grid.width,  # the bucket's first step
                "last_step": r["last_step"],
                "min": r["lo"],
                "max": r["hi"],
                "last": last_values[(r["run_id"], r["name"], r["last_step"])],
            }
        )
    return {
        "bucket": grid.width,
        "series": [
            {"run": run_id, "name": name, "points": pts}
            for (run_id, name), pts in sorted(series.items())
        ],
    }


def log_lines(
    *,
    run_id: int,
    after: int = 0,
    limit: int = 500,
    q: str = "",
    level: str = "",
    source: str = "",
    tail: bool = False,
) -> dict[str, Any]:
    """The run's log lines after ``after`` (by seq), at most ``limit``: those containing
    ``q`` (any case), of ``level`` or above, from ``source``. ``tail``: the last ``limit``
    of them instead of the first. ``last_seq`` is the newest line stored (any filter)."""
    from gyre_web.runs.logs import LEVELS
    from gyre_web.runs.models import RunLogLine

    rows = RunLogLine.objects.filter(run_id=run_id, seq__gt=after)
    if q:
        rows = rows.filter(text__icontains=q)
    if level:
        rows = rows.filter(level__in=LEVELS[LEVELS.index(level) :])
    if source:
        rows = rows.filter(source=source)
    page = list(rows.order_by("-seq")[:limit])[::-1] if tail else list(rows.order_by("seq")[:limit])
    last = RunLogLine.objects.filter(run_id=run_id).aggregate(m=Max("seq"))["m"] or 0
    return {"run": run_id, "last_seq": last, "lines": [r.as_message() for r in page]}
