"""A team's webhooks: list and read for its members, register and remove for its owners
and admins; each webhook's delivery log."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import policy
from gyre_web.alerts import net, selectors, services
from gyre_web.alerts.models import Webhook
from gyre_web.alerts.serializers import DeliverySerializer, WebhookSerializer
from gyre_web.openapi import ERROR


class WebhookViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = WebhookSerializer

    def get_queryset(self) -> QuerySet[Webhook]:
        return selectors.webhooks_visible(self.request.user)

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        ser = WebhookSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        team = ser.validated_data["team"]
        policy.require(request, team.pk)
        try:
            hook = services.create_webhook(
                team=team,
                url=ser.validated_data["url"],
                events=ser.validated_data["events"],
                name=ser.validated_data.get("name", ""),
                created_by=request.user,
            )
        except net.Refused as err:  # a non-public address, user:password@, no such host
            return Response({"url": [str(err)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(WebhookSerializer(hook).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 403: ERROR})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance: Webhook) -> None:
        policy.require(self.request, instance.team_id)
        instance.delete()

    @extend_schema(responses=DeliverySerializer(many=True))
    @action(
        detail=True, methods=["get"], serializer_class=DeliverySerializer, pagination_class=None
    )
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        """The webhook's last 200 deliveries, newest first: each attempt's count, last
        HTTP status or error, and the body posted."""
        hook = self.get_object()
        rows = selectors.deliveries_of(hook)
        return Response(DeliverySerializer(rows, many=True).data)
