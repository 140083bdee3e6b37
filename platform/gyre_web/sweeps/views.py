"""Sweeps: launch one (a writer in the experiment's team), list them (?experiment=), read
one with its runs' swept values, status and final benchmark, and cancel it."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import policy
from gyre_web.access import share_link_of
from gyre_web.openapi import ERROR
from gyre_web.runs.config_policy import ConfigInvalid
from gyre_web.sweeps import selectors, services
from gyre_web.sweeps.models import Sweep
from gyre_web.sweeps.serializers import (
    SweepCreateSerializer,
    SweepDetailSerializer,
    SweepSerializer,
)


class SweepFilter(filters.FilterSet):
    class Meta:
        model = Sweep
        fields = ["experiment"]


class SweepViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    filterset_class = SweepFilter
    share_link_readable = True

    def get_queryset(self) -> QuerySet[Sweep]:
        return selectors.sweeps_visible(self.request.user, share_link_of(self.request))

    def get_serializer_class(self) -> Any:
        return SweepDetailSerializer if self.action == "retrieve" else SweepSerializer

    def _detail(self, sweep: Sweep) -> dict[str, Any]:
        sweep.runs = selectors.sweep_runs(sweep)  # type: ignore[attr-defined]
        return SweepDetailSerializer(sweep).data  # type: ignore[no-any-return]

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self._detail(self.get_object()))

    @extend_schema(request=SweepCreateSerializer, responses={201: SweepDetailSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        ser = SweepCreateSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        policy.require(request, data["experiment"].team_id)
        try:
            sweep = services.create_sweep(
                experiment=data["experiment"], base_config=data["base_config"],
                mode=data["mode"], params=data["params"], samples=data["samples"],
                seed=data["seed"], max_concurrent=data["max_concurrent"], name=data["name"],
                created_by=request.user,
            )  # fmt: skip
        except ConfigInvalid as err:
            raise ValidationError({"base_config": {f: [m] for f, m in err.errors}}) from None
        except services.SpecInvalid as err:
            raise ValidationError({f: [m] for f, m in err.errors}) from None
        return Response(self._detail(sweep), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: SweepDetailSerializer, 403: ERROR})
    @action(detail=True, methods=["post"], serializer_class=None)
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """No more launches; the pending runs cancelled, the active ones asked to stop."""
        sweep = self.get_object()
        policy.require(request, sweep.experiment.team_id)
        services.cancel_sweep(sweep=sweep)
        return Response(self._detail(self.get_queryset().get(pk=sweep.pk)))
