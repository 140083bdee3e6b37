"""Nodes, GPUs, units (GPUs that host one model replica together) and role intervals — the
GPU role timeline. A GPU is held by at most one run at a time (a partial unique index)."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Node(models.Model):
    name = models.CharField(max_length=200, unique=True)
    address = models.CharField(max_length=200, blank=True)
    ray_node_id = models.CharField(max_length=64, blank=True)
    alive = models.BooleanField(default=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.IntegerField()
    model = models.CharField(max_length=100, blank=True)
    memory_mb = models.IntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_on_node")]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}"


class Unit(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="units")
    index = models.IntegerField()  # the unit number the runtime reports
    gpus = models.ManyToManyField(Gpu, through="GpuLease", related_name="units")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="unit_index_in_run")]

    def __str__(self) -> str:
        return f"unit {self.index} of run {self.run_id}"


class GpuLease(models.Model):
    """A GPU held by a unit of a run until ``released_at``."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="leases")
    unit = models.ForeignKey(Unit, on_delete=models.CASCADE, related_name="leases")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="gpu_leases")
    acquired_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="one_holder_per_gpu"
            )
        ]


class RoleInterval(models.Model):
    unit = models.ForeignKey(Unit, on_delete=models.CASCADE, related_name="intervals")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="role_intervals")
    role = models.CharField(max_length=12)  # rollout, train, switching, idle
    start = models.FloatField()  # seconds on the run's clock
    end = models.FloatField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["run", "start"], name="role_interval_by_run")]


class ClusterSeq(models.Model):
    """One row (pk 1): the next ``ClusterEvent.seq``. Taken ``select_for_update`` by each
    writer, so concurrent transactions number their events one after the other, without
    gaps (a rolled-back writer gives its numbers back)."""

    next_seq = models.BigIntegerField(default=1)


class ClusterEvent(models.Model):
    """The cluster's own event log (not a run's): nodes gone and back, GPUs leased and
    released; ``seq`` is contiguous from 1. Kinds in ``gyre_web.cluster.kinds``."""

    seq = models.BigIntegerField(unique=True)
    kind = models.CharField(max_length=32)
    wall = models.DateTimeField(default=timezone.now)
    data = models.JSONField(default=dict)

    def as_message(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "wall": self.wall.isoformat(),
            "data": self.data,
        }


class Deployment(models.Model):
    """This deployment's identity: one row, made by its migration (or at first use), so
    every web and worker process on this database agrees. Launch messages carry ``key``;
    a worker that receives another deployment's launch records it here
    (``cluster.deployments``) and ``readyz`` reports that two deployments share a broker."""

    key = models.CharField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The last launch of another deployment that reached a worker of this one.
    other_key = models.CharField(max_length=64, blank=True)
    other_run_id = models.BigIntegerField(null=True, blank=True)
    other_seen_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"deployment {self.key}"
