"""Reads for the GPU inventory and the role timeline."""

from __future__ import annotations

from django.db.models import QuerySet

from gyre_web.cluster.models import Gpu, GpuLease, RoleInterval


def gpus_with_holders() -> QuerySet[Gpu]:
    return Gpu.objects.select_related("node").order_by("node__name", "index")


def holder_of(gpu: Gpu) -> int | None:
    lease = GpuLease.objects.filter(gpu=gpu, released_at__isnull=True).first()
    return lease.run_id if lease else None


def role_timeline(*, run_id: int) -> QuerySet[RoleInterval]:
    return RoleInterval.objects.filter(run_id=run_id).select_related("unit").order_by("start")
