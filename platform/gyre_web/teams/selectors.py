"""Reads for teams, memberships, tokens and share links."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from gyre_web.teams.models import ApiToken, Membership, ShareLink, Team
from gyre_web.teams.services import digest_key


def teams_of(user: Any) -> QuerySet[Team]:
    if not getattr(user, "is_authenticated", False):
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def role_in(user: Any, team_id: int) -> str | None:
    if not getattr(user, "is_authenticated", False):
        return None
    return (
        Membership.objects.filter(team_id=team_id, user=user).values_list("role", flat=True).first()
    )


def active_token(key: str) -> ApiToken | None:
    return (
        ApiToken.objects.select_related("user")
        .filter(digest=digest_key(key), revoked_at__isnull=True, user__is_active=True)
        .first()
    )


def active_share_link(key: str) -> ShareLink | None:
    return ShareLink.objects.filter(digest=digest_key(key), revoked_at__isnull=True).first()


def tokens_of(user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user)


def share_links_of(user: Any) -> QuerySet[ShareLink]:
    return ShareLink.objects.filter(team__in=teams_of(user))
