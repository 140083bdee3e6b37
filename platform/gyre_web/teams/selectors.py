"""Reads for teams, memberships, tokens and share links."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.utils import timezone

from gyre_web.teams.models import ApiToken, LoginFailures, Membership, ShareLink, Team
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


def unexpired() -> Q:
    """Tokens and share links that have not expired (``expires_at`` null: never)."""
    return Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())


def active_token(key: str) -> ApiToken | None:
    return (
        ApiToken.objects.select_related("user")
        .filter(unexpired(), digest=digest_key(key), revoked_at__isnull=True, user__is_active=True)
        .first()
    )


def active_share_link(key: str) -> ShareLink | None:
    live = ShareLink.objects.filter(unexpired(), digest=digest_key(key), revoked_at__isnull=True)
    return live.first()


def credentials_lost(
    *, token_id: int | None, link_id: int | None, user_id: int | None, session_key: str | None
) -> str | None:
    """Why the credentials a websocket connected with no longer hold, or ``None``: the API
    token revoked or expired (or its user deactivated), the share link revoked, expired or gone (its team or
    target deleted), the user deactivated, or the session ended (signed out)."""
    if token_id is not None:
        active = ApiToken.objects.filter(unexpired(), pk=token_id, revoked_at__isnull=True)
        if not active.filter(user__is_active=True).exists():
            return "token_revoked"
    if link_id is not None:
        active_link = ShareLink.objects.filter(unexpired(), pk=link_id, revoked_at__isnull=True)
        return None if active_link.exists() else "share_link_revoked"
    users = get_user_model().objects.filter(pk=user_id, is_active=True)
    if user_id is None or not users.exists():
        return "user_inactive"
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if token_id is None and session_key is not None and not store().exists(session_key):
        return "signed_out"
    return None


def tokens_of(user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user)


def share_links_of(user: Any) -> QuerySet[ShareLink]:
    return ShareLink.objects.filter(team__in=teams_of(user))


def login_locked_for(*, keys: list[str]) -> float:
    """Seconds until sign-ins with any of ``keys`` are accepted again (0: not locked)."""
    now = timezone.now()
    until = (
        LoginFailures.objects.filter(key__in=keys, locked_until__gt=now)
        .order_by("-locked_until")
        .values_list("locked_until", flat=True)
        .first()
    )
    return (until - now).total_seconds() if until is not None else 0.0
