"""Sweep reads: the sweeps a caller may see, and one sweep's runs with their swept values,
status, whether launched yet (a queued run not launched waits for a slot under the cap),
final benchmark (the scores at the last step that has any; ``score`` their mean
over suites) and the last value of each metric."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from gyre_web.runs.models import ACTIVE, BenchmarkScore, LaunchOutbox, MetricPoint
from gyre_web.runs.selectors import experiments_visible
from gyre_web.sweeps.models import Sweep, SweepRun


def sweeps_visible(user: Any, link: Any = None) -> QuerySet[Sweep]:
    live = Count("sweep_runs", filter=Q(sweep_runs__run__status__in=ACTIVE))
    return (
        Sweep.objects.filter(experiment__in=experiments_visible(user, link))
        .annotate(run_count=Count("sweep_runs"), active_count=live)
        .order_by("-id")
    )


def status_of(sweep: Sweep) -> str:
    """cancelled, running (a run is queued, starting or running) or finished."""
    if sweep.cancelled_at is not None:
        return "cancelled"
    active = getattr(sweep, "active_count", None)
    if active is None:
        active = sweep.sweep_runs.filter(run__status__in=ACTIVE).count()
    return "running" if active else "finished"


def _final_benchmarks(run_ids: list[int]) -> dict[int, tuple[int, dict[str, float]]]:
    out: dict[int, tuple[int, dict[str, float]]] = {}
    rows = BenchmarkScore.objects.filter(run_id__in=run_ids).order_by("run_id", "-step", "suite")
    for run_id, step, suite, score in rows.values_list("run_id", "step", "suite", "score"):
        last_step, scores = out.setdefault(run_id, (step, {}))
        if step == last_step:
            scores[suite] = score
    return out


def _final_metrics(run_ids: list[int]) -> dict[int, dict[str, float]]:
    last = MetricPoint.objects.filter(run_id=OuterRef("run_id"), name=OuterRef("name"))
    rows = MetricPoint.objects.filter(
        run_id__in=run_ids, step=Subquery(last.order_by("-step").values("step")[:1])
    )
    out: dict[int, dict[str, float]] = {}
    for run_id, name, value in rows.values_list("run_id", "name", "value"):
        out.setdefault(run_id, {})[name] = value
    return out


def sweep_runs(sweep: Sweep) -> list[dict[str, Any]]:
    rows = list(SweepRun.objects.filter(sweep=sweep).select_related("run").order_by("index"))
    ids = [r.run_id for r in rows]
    benchmarks, metrics = _final_benchmarks(ids), _final_metrics(ids)
    launched = set(LaunchOutbox.objects.filter(run_id__in=ids).values_list("run_id", flat=True))
    out = []
    for r in rows:
        step, scores = benchmarks.get(r.run_id, (None, {}))
        out.append(
            {
                "run": r.run_id,
                "index": r.index,
                "name": r.run.name,
                "values": r.values,
                "status": r.run.status,
                "launched": r.run_id in launched,
                "step": r.run.step,
                "steps": r.run.steps,
                "benchmark_step": step,
                "benchmark": scores,
                "score": sum(scores.values()) / len(scores) if scores else None,
                "metrics": metrics.get(r.run_id, {}),
            }
        )
    return out
