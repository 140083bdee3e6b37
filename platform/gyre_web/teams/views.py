"""Teams and memberships, API tokens (key shown once), share links (key shown once), and
who the caller is (the session)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import policy
from gyre_web.openapi import ERROR
from gyre_web.teams import selectors, services
from gyre_web.teams.models import ApiToken, Membership, ShareLink, Team
from gyre_web.teams.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenSerializer,
    MembershipSerializer,
    SessionSerializer,
    ShareLinkCreatedSerializer,
    ShareLinkSerializer,
    TeamSerializer,
)


def _refused(err: services.MembershipRefused) -> Response:
    """403 for a change the actor may not make, 409 for one that would leave no owner."""
    code = 409 if isinstance(err, services.LastOwner) else 403
    return Response({err.field: [str(err)], "detail": str(err)}, status=code)


class TeamViewSet(viewsets.ModelViewSet):
    serializer_class = TeamSerializer

    def get_queryset(self) -> QuerySet[Team]:
        return selectors.teams_of(self.request.user).prefetch_related("memberships")

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        try:
            serializer.instance = services.create_team(
                name=data["name"], slug=data.get("slug", ""), owner=self.request.user
            )
        except services.SlugTaken as err:
            raise ValidationError({"slug": str(err)}) from None

    def perform_update(self, serializer: Any) -> None:
        policy.require(self.request, serializer.instance.pk)
        serializer.save()

    def perform_destroy(self, instance: Team) -> None:
        policy.require(self.request, instance.pk)
        services.delete_team(team=instance)

    @extend_schema(methods=["GET"], responses=MembershipSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        request=MembershipSerializer,
        responses={201: MembershipSerializer, 409: ERROR},  # 409: the last owner
    )
    @action(
        detail=True,
        methods=["get", "post"],
        serializer_class=MembershipSerializer,
        pagination_class=None,
    )
    def members(self, request: Request, pk: str | None = None) -> Response:
        team = self.get_object()
        if request.method == "GET":
            rows = Membership.objects.filter(team=team).select_related("user").order_by("id")
            return Response(MembershipSerializer(rows, many=True).data)
        policy.require(request, team.pk)
        ser = MembershipSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            m = services.set_membership(
                team=team,
                user=ser.validated_data["user"],
                role=ser.validated_data["role"],
                by=request.user,
            )
        except services.MembershipRefused as err:
            return _refused(err)
        return Response(MembershipSerializer(m).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 409: ERROR})  # 409: the last owner
    @action(detail=True, methods=["delete"], url_path=r"members/(?P<username>[^/]+)")
    def remove_member(
        self, request: Request, pk: str | None = None, username: str = ""
    ) -> Response:
        team = self.get_object()
        if "\x00" in username:  # no user has it, and Postgres cannot even compare it
            raise NotFound("no such user")
        user = get_object_or_404(get_user_model(), username=username)
        if user != request.user:
            policy.require(request, team.pk)
        try:
            services.remove_membership(team=team, user=user, by=request.user)
        except services.MembershipRefused as err:
            return _refused(err)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Create returns the key once (``key``); delete revokes."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()  # typed paths in the schema; get_queryset filters

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.tokens_of(self.request.user)

    @extend_schema(responses={201: ApiTokenCreatedSerializer, 403: ERROR})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if isinstance(request.auth, ApiToken):  # else revoking it would leave its children
            raise PermissionDenied("an API token cannot create tokens: sign in to create one")
        ser = self.get_serializer(data=request.data)
        ser.is_valid(raise_exception=True)
        token, key = services.create_api_token(
            user=request.user,
            name=ser.validated_data["name"],
            expires_at=ser.validated_data.get("expires_at"),
        )
        return Response({**ApiTokenSerializer(token).data, "key": key}, status=201)

    def perform_destroy(self, instance: ApiToken) -> None:
        services.revoke_api_token(token=instance)


class ShareLinkViewSet(ApiTokenViewSet):
    """Create returns the key once (``key``); delete revokes."""

    serializer_class = ShareLinkSerializer  # type: ignore[assignment]
    filterset_fields = ["team", "experiment", "run"]
    queryset = ShareLink.objects.none()  # type: ignore[assignment]

    def get_queryset(self) -> QuerySet[ShareLink]:  # type: ignore[override]
        return selectors.share_links_of(self.request.user)

    @extend_schema(responses={201: ShareLinkCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        ser = self.get_serializer(data=request.data)
        ser.is_valid(raise_exception=True)
        experiment, run = ser.validated_data.get("experiment"), ser.validated_data.get("run")
        policy.require(request, (experiment or run.experiment).team_id)
        link, key = services.create_share_link(
            created_by=request.user,
            experiment=experiment,
            run=run,
            expires_at=ser.validated_data.get("expires_at"),
        )
        return Response(
            {**ShareLinkSerializer(link, context={"request": request}).data, "key": key}, status=201
        )

    def perform_destroy(self, instance: ShareLink) -> None:  # type: ignore[override]
        policy.require(self.request, instance.team_id)
        services.revoke_share_link(link=instance)


@extend_schema(responses={200: SessionSerializer, 401: ERROR})
@api_view(["GET"])
@permission_classes([AllowAny])
def session(request: Request) -> Response:
    """Who the caller is. Signed out (or a share link) is an answer, not an error: 200 with
    ``authenticated: false``; only credentials that are sent and refused (a revoked API
    token or share link) answer 401."""
    user = request.user
    signed_in = bool(user and user.is_authenticated)
    body = {
        "authenticated": signed_in,
        "username": user.get_username() if signed_in else None,
        "staff": bool(signed_in and user.is_staff),
    }
    return Response(SessionSerializer(body).data)
