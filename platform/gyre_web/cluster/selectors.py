"""Reads for the GPU inventory and the role timeline."""

from __future__ import annotations

from typing import Any

from django.db.models import (
    Count,
    F,
    FloatField,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Greatest, Least

from gyre_web.cluster.models import ClusterEvent, Gpu, GpuLease, RoleInterval, Unit
from gyre_web.runs.models import RunEvent

ROLE_NAMES = ("rollout", "train", "switching", "idle")


def gpus_with_holders() -> QuerySet[Gpu]:
    return Gpu.objects.select_related("node").order_by("node__name", "index")


def holder_of(gpu: Gpu) -> int | None:
    lease = GpuLease.objects.filter(gpu=gpu, released_at__isnull=True).first()
    return lease.run_id if lease else None


def role_timeline(*, run_id: int) -> QuerySet[RoleInterval]:
    return RoleInterval.objects.filter(run_id=run_id).select_related("unit").order_by("start")


def _unit_weight(unit_ref: str) -> Greatest:
    """GPUs a unit ever leased, 1 when it leased none (a simulated run's units)."""
    leased = (
        GpuLease.objects.filter(unit=OuterRef(unit_ref))
        .values("unit")
        .annotate(n=Count("gpu", distinct=True))
        .values("n")
    )
    return Greatest(Coalesce(Subquery(leased, output_field=IntegerField()), 1), 1)


def run_clock(*, run_id: int) -> float:
    """The run's clock now: its last event's time, or the latest interval bound if later."""
    last = RunEvent.objects.filter(run_id=run_id).order_by("-seq").values_list("t", flat=True)
    bounds = RoleInterval.objects.filter(run_id=run_id).aggregate(s=Max("start"), e=Max("end"))
    return max(0.0, last.first() or 0.0, bounds["s"] or 0.0, bounds["e"] or 0.0)


def role_intervals(
    *, run_id: int, t0: float | None = None, t1: float | None = None, limit: int = 20000
) -> dict[str, Any]:
    """The role intervals of a run that overlap the window ``[t0, t1]`` (default: the whole
    run so far), at most ``limit`` of them in start order (``truncated`` says more exist),
    each unit's GPU count, and the GPU-seconds held in each role within the window, summed
    in the database over every interval in it, not only those returned. An open interval
    (``end`` null) runs to the run's clock now (``horizon``)."""
    horizon = run_clock(run_id=run_id)
    lo = 0.0 if t0 is None else t0
    hi = horizon if t1 is None else t1
    in_window = RoleInterval.objects.filter(run_id=run_id, start__lte=hi).filter(
        Q(end__isnull=True) | Q(end__gte=lo)
    )
    span = Least(Coalesce(F("end"), Value(horizon)), Value(hi)) - Greatest(F("start"), Value(lo))
    by_role = (
        in_window.annotate(w=_unit_weight("unit"), span=span)
        .values("role")
        .annotate(gs=Sum(F("span") * F("w"), output_field=FloatField()))
    )
    gpu_seconds = dict.fromkeys(ROLE_NAMES, 0.0)
    for row in by_role:
        gpu_seconds[row["role"]] = gpu_seconds.get(row["role"], 0.0) + max(0.0, row["gs"] or 0.0)
    total = sum(gpu_seconds.values())
    rows = list(
        in_window.order_by("start", "unit__index", "pk").values_list(
            "unit__index", "role", "start", "end"
        )[: limit + 1]
    )
    units = (
        Unit.objects.filter(run_id=run_id)
        .annotate(w=_unit_weight("pk"))
        .order_by("index")
        .values_list("index", "w")
    )
    return {
        "run": run_id,
        "t0": lo,
        "t1": hi,
        "horizon": horizon,
        "units": [{"unit": index, "gpus": w} for index, w in units],
        "intervals": [
            {"unit": u, "role": role, "start": start, "end": end}
            for u, role, start, end in rows[:limit]
        ],
        "truncated": len(rows) > limit,
        "gpu_seconds": gpu_seconds,
        "shares": {r: (s / total if total else 0.0) for r, s in gpu_seconds.items()},
    }


def cluster_events_after(*, after: int, limit: int) -> list[dict[str, Any]]:
    """The cluster event log after ``after``, in ``seq`` order, as websocket messages."""
    rows = ClusterEvent.objects.filter(seq__gt=after).order_by("seq")[:limit]
    return [e.as_message() for e in rows]
