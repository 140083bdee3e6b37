"""The GPU inventory: readable by every signed-in user, registered by staff."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import serializers, viewsets
from rest_framework.exceptions import PermissionDenied

from gyre_web.cluster import selectors
from gyre_web.cluster.models import Gpu


class GpuSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    node_alive = serializers.BooleanField(source="node.alive", read_only=True)
    node_last_seen_at = serializers.DateTimeField(
        source="node.last_seen_at", read_only=True, allow_null=True
    )
    run = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "node_name",
            "node_alive",
            "node_last_seen_at",
            "index",
            "model",
            "memory_mb",
            "run",
        ]

    def get_run(self, gpu: Gpu) -> int | None:
        return selectors.holder_of(gpu)


class GpuViewSet(viewsets.ModelViewSet):
    serializer_class = GpuSerializer
    filterset_fields = ["node", "model"]

    def get_queryset(self) -> QuerySet[Gpu]:
        return selectors.gpus_with_holders()

    def check_permissions(self, request: Any) -> None:
        super().check_permissions(request)
        if request.method not in ("GET", "HEAD", "OPTIONS") and not request.user.is_staff:
            raise PermissionDenied("only an administrator registers GPUs")
