"""A team's datasets: upload (owner, admin, member), list and read (every role), delete
(owner, admin, member). Outsiders and share links find none (404): a share link reads
runs, not a team's files."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import policy
from gyre_web.access import MemberOrShareLinkReadOnly, share_link_of
from gyre_web.datasets import selectors, services
from gyre_web.datasets.models import Dataset, Kind
from gyre_web.datasets.serializers import DatasetSerializer, DatasetUploadSerializer
from gyre_web.openapi import ERROR


class MembersOnly(MemberOrShareLinkReadOnly):
    """Signed-in users (objects are then checked by team); a share link finds nothing."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if share_link_of(request) is not None:
            raise NotFound()
        return super().has_permission(request, view)


@extend_schema_field(OpenApiTypes.INT)
class _IdFilter(filters.NumberFilter):
    field_class = forms.IntegerField  # digits only; no decimal reaches a bigint column


class DatasetFilter(filters.FilterSet):
    """``?team=`` by id (a team the caller is not in lists nothing, as one that does not
    exist), ``?kind=``."""

    team = _IdFilter(field_name="team_id", min_value=1, max_value=2**63 - 1)
    kind = filters.ChoiceFilter(choices=Kind.choices)

    class Meta:
        model = Dataset
        fields = ["team", "kind"]


class DatasetViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = DatasetSerializer
    permission_classes = [MembersOnly]
    parser_classes = [MultiPartParser]
    filterset_class = DatasetFilter

    def get_queryset(self) -> QuerySet[Dataset]:
        return selectors.datasets_visible(self.request.user).select_related("created_by")

    @extend_schema(
        request={"multipart/form-data": DatasetUploadSerializer},
        responses={201: DatasetSerializer, 400: ERROR},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Upload a file once (multipart ``file``, ``name``, ``kind``, ``team``): it is
        checked as its kind's readers read it and named by id in run configs
        (``dataset:<id>``). Bad input is answered 400 naming the field."""
        ser = DatasetUploadSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        team = ser.validated_data["team"]
        policy.require(request, team.pk)
        try:
            row = services.create_dataset(
                team=team,
                name=ser.validated_data["name"],
                kind=ser.validated_data["kind"],
                upload=ser.validated_data["file"],
                created_by=request.user,
            )
        except services.DatasetRejected as err:
            raise ValidationError({err.field: [err.problem]}) from None
        return Response(DatasetSerializer(row).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 403: ERROR})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Remove the dataset and its file (a run that names it later fails to start)."""
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance: Dataset) -> None:
        policy.require(self.request, instance.team_id)
        services.delete_dataset(dataset=instance)
