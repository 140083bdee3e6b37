"""Writes for the GPU inventory, leases and the role timeline."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from gyre_web.cluster.models import Gpu, GpuLease, Node, RoleInterval, Unit


class GpuBusy(RuntimeError):
    pass


@transaction.atomic
def register_gpu(*, node_name: str, index: int, model: str = "", memory_mb: int = 0) -> Gpu:
    node, _ = Node.objects.get_or_create(name=node_name)
    gpu, _ = Gpu.objects.update_or_create(
        node=node, index=index, defaults={"model": model, "memory_mb": memory_mb}
    )
    return gpu


def lease_gpus(*, run_id: int, unit_index: int, gpus: list[Gpu]) -> Unit:
    """Give ``gpus`` to a unit of a run; raises GpuBusy if another run holds one."""
    try:
        with transaction.atomic():
            unit, _ = Unit.objects.get_or_create(run_id=run_id, index=unit_index)
            for gpu in gpus:
                held = GpuLease.objects.filter(gpu=gpu, released_at__isnull=True).first()
                if held is not None and held.run_id == run_id:
                    continue
                GpuLease.objects.create(gpu=gpu, unit=unit, run_id=run_id)
    except IntegrityError:
        raise GpuBusy(f"a GPU among {[str(g) for g in gpus]} is held by another run") from None
    return unit


def release_gpus(*, run_id: int) -> int:
    return GpuLease.objects.filter(run_id=run_id, released_at__isnull=True).update(
        released_at=timezone.now()
    )


@transaction.atomic
def record_role_changes(*, run_id: int, events: list[dict[str, Any]]) -> None:
    """Close each unit's open interval and open one for its new role."""
    for e in events:
        data = e["data"]
        unit, _ = Unit.objects.get_or_create(run_id=run_id, index=int(data["unit"]))
        RoleInterval.objects.filter(unit=unit, end__isnull=True).update(end=float(e["t"]))
        RoleInterval.objects.create(
            unit=unit, run_id=run_id, role=str(data["to_role"]), start=float(e["t"])
        )


def close_role_intervals(*, run_id: int, t: float) -> None:
    RoleInterval.objects.filter(run_id=run_id, end__isnull=True).update(end=t)
