"""Writes for the GPU inventory, leases and the role timeline."""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from gyre_web.cluster import deployments
from gyre_web.cluster.kinds import GPU_LEASE, GROUP, KINDS, NODE_STATUS
from gyre_web.cluster.models import (
    ClusterEvent,
    ClusterSeq,
    Deployment,
    Gpu,
    GpuLease,
    Node,
    RoleInterval,
    Unit,
)
from gyre_web.wake import wake

log = logging.getLogger(__name__)


def foreign_launch(*, run_id: int, sender: str) -> str:
    """Why this deployment's worker must not take the launch of ``run_id`` sent by
    deployment ``sender`` ("" when it may: its own; a message without a key, from before
    keys, whose run is here). A foreign one is recorded, and logged as an error the first
    time (a launch bounced between deployments comes back every second or so)."""
    from gyre_web.runs.models import Run

    me = deployments.this_deployment()
    if sender == me.key:
        return ""
    if not sender and Run.objects.filter(pk=run_id).exists():
        return ""
    why = (
        f"launch of run {run_id} belongs to deployment {sender}, not to this one ({me.key}):"
        " two deployments share this broker; give each its own Redis database"
        if sender
        else f"launch of run {run_id} carries no deployment and this database holds no such run"
    )
    again = (me.other_key, me.other_run_id) == (sender or "?", run_id)  # the same, bounced
    log.log(logging.DEBUG if again else logging.ERROR, "%s", why)
    Deployment.objects.filter(pk=me.pk).update(
        other_key=sender or "?", other_run_id=run_id, other_seen_at=timezone.now()
    )
    return why


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
    """Give ``gpus`` to a unit of a run; raises GpuBusy if another run holds one. The GPUs
    newly leased make one ``gpu_lease`` event (none when the run held them all already)."""
    try:
        with transaction.atomic():
            unit, _ = Unit.objects.get_or_create(run_id=run_id, index=unit_index)
            leased: list[int] = []
            for gpu in gpus:
                held = GpuLease.objects.filter(gpu=gpu, released_at__isnull=True).first()
                if held is not None and held.run_id == run_id:
                    continue
                GpuLease.objects.create(gpu=gpu, unit=unit, run_id=run_id)
                leased.append(gpu.pk)
            if leased:
                data = {"run": run_id, "unit": unit_index, "gpus": leased, "held": True}
                append_cluster_events(events=[(GPU_LEASE, data)])
    except IntegrityError:
        raise GpuBusy(f"a GPU among {[str(g) for g in gpus]} is held by another run") from None
    return unit


@transaction.atomic
def release_gpus(*, run_id: int) -> int:
    """Release every GPU a run holds: one ``gpu_lease`` event (held false) per unit."""
    open_leases = GpuLease.objects.select_for_update().filter(
        run_id=run_id, released_at__isnull=True
    )
    by_unit: dict[int, list[int]] = {}
    for unit_index, gpu_id in open_leases.order_by("unit__index", "gpu_id").values_list(
        "unit__index", "gpu_id"
    ):
        by_unit.setdefault(unit_index, []).append(gpu_id)
    count = GpuLease.objects.filter(run_id=run_id, released_at__isnull=True).update(
        released_at=timezone.now()
    )
    append_cluster_events(
        events=[
            (GPU_LEASE, {"run": run_id, "unit": unit, "gpus": ids, "held": False})
            for unit, ids in by_unit.items()
        ]
    )
    return count


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


@transaction.atomic
def sync_inventory(*, nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Write Ray's view of the cluster (``gyre_core.runtime.inventory.NodeRecord.to_dict()``
    records) into Node and Gpu rows. A node is matched by its Ray node id, else by name (a
    node registered by hand is adopted). A node Ray reports dead, or no longer reports,
    becomes ``alive=False`` and keeps its rows: nothing is deleted, leases stay valid.
    Returns counts of nodes seen alive, nodes marked gone and GPU rows written."""
    now = timezone.now()
    seen: set[str] = set()
    alive = gone = gpus = 0
    changed: list[Node] = []  # made, or alive flipped: a node_status event each
    for rec in nodes:
        node_id = str(rec["node_id"])
        seen.add(node_id)
        node = (
            Node.objects.select_for_update().filter(ray_node_id=node_id).first()
            or Node.objects.select_for_update().filter(name=str(rec["name"])).first()
        )
        if node is None:
            if not rec["alive"]:
                continue  # died before we ever saw it: nothing to show
            node = Node(name=str(rec["name"]))
        if node.pk is None or node.alive != bool(rec["alive"]):
            changed.append(node)
        node.ray_node_id, node.alive = node_id, bool(rec["alive"])
        if rec["alive"]:
            node.address, node.last_seen_at = str(rec["address"]), now
            alive += 1
        else:
            gone += 1
        node.save()
        count = int(rec["gpus"]) or int(rec["gpu_units"])  # a dead node reports none: keep rows
        model = str(rec["accelerator"]) or ("GPU" if int(rec["gpus"]) else "gpu_unit")
        for index in range(count):
            Gpu.objects.update_or_create(node=node, index=index, defaults={"model": model})
            gpus += 1
    missing = Node.objects.filter(alive=True).exclude(ray_node_id="").exclude(ray_node_id__in=seen)
    for node in missing.select_for_update().order_by("pk"):  # left (a new head forgot it)
        node.alive = False
        node.save(update_fields=["alive"])
        changed.append(node)
        gone += 1
    counts = dict(
        Gpu.objects.filter(node__in=[n.pk for n in changed])
        .values_list("node")
        .annotate(n=Count("pk"))
        .values_list("node", "n")
    )
    append_cluster_events(
        events=[
            (
                NODE_STATUS,
                {
                    "node": n.name,
                    "node_id": n.ray_node_id,
                    "alive": n.alive,
                    "gpus": counts.get(n.pk, 0),
                },
            )
            for n in changed
        ]
    )
    return {"alive": alive, "gone": gone, "gpus": gpus}


def append_cluster_events(*, events: list[tuple[str, dict[str, Any]]]) -> list[ClusterEvent]:
    """Append to the cluster event log in the caller's transaction, numbered after the last
    (the counter row is locked until that transaction ends: call this last in it, after
    the rows it reports, so no writer waits on another while holding the counter), and
    wake the ``cluster`` group once it commits."""
    if not events:
        return []
    for kind, _ in events:
        if kind not in KINDS:
            raise ValueError(f"unknown cluster event kind {kind!r}")
    with transaction.atomic():
        counter = ClusterSeq.objects.select_for_update().filter(pk=1).first()
        if counter is None:  # the first event ever (or after a test flushed the tables)
            ClusterSeq.objects.bulk_create([ClusterSeq(pk=1)], ignore_conflicts=True)
            counter = ClusterSeq.objects.select_for_update().get(pk=1)
        first = counter.next_seq
        rows = ClusterEvent.objects.bulk_create(
            [
                ClusterEvent(seq=first + i, kind=kind, data=data)
                for i, (kind, data) in enumerate(events)
            ]
        )
        ClusterSeq.objects.filter(pk=1).update(next_seq=first + len(rows))
        last = rows[-1].seq
        transaction.on_commit(lambda: _wake(last))
    return rows


def _wake(last_seq: int) -> None:
    """The consumers of the cluster stream read the table after their cursor (they also
    poll it, so a lost wake-up only delays)."""
    wake(GROUP, {"type": "cluster.events", "last_seq": last_seq})
