"""Who may do what: team roles for members, read-only scope for share links, 404 for
objects outside a user's teams (querysets are filtered), 403 for a viewer who writes."""

from __future__ import annotations

from typing import Any

from rest_framework import pagination, permissions
from rest_framework.exceptions import PermissionDenied

from gyre_web.teams.models import MANAGE_ROLES, WRITE_ROLES, ShareLink
from gyre_web.teams.selectors import role_in


def share_link_of(request: Any) -> ShareLink | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ShareLink) else None


class MemberOrShareLinkReadOnly(permissions.BasePermission):
    """Signed-in users pass (objects are then checked by team); a share link only reads."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if share_link_of(request) is not None:
            return request.method in permissions.SAFE_METHODS and getattr(
                view, "share_link_readable", False
            )
        return bool(request.user and request.user.is_authenticated)


def require_role(request: Any, team_id: int, roles: frozenset[str] = WRITE_ROLES) -> str:
    """Raise 403 unless the request's user holds one of ``roles`` in the team."""
    if share_link_of(request) is not None:
        raise PermissionDenied("a share link is read-only")
    role = role_in(request.user, team_id)
    if role not in roles:
        raise PermissionDenied(f"your role in this team ({role or 'none'}) cannot do this")
    return role


def require_manager(request: Any, team_id: int) -> str:
    return require_role(request, team_id, MANAGE_ROLES)


class IdCursorPagination(pagination.CursorPagination):
    ordering = "-id"
    page_size_query_param = "page_size"
    max_page_size = 500
