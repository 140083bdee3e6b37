"""REST authentication: API tokens (``Authorization: Token KEY`` or ``Bearer KEY``) and
share links (``X-Gyre-Share: KEY`` header or ``?share=KEY``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework import authentication, exceptions

from gyre_web.teams import selectors, services


class TokenAuthentication(authentication.BaseAuthentication):
    keywords = ("token", "bearer")

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        parts = header.split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header: 'Token <key>'")
        token = selectors.active_token(parts[1])
        if token is None:
            raise exceptions.AuthenticationFailed("unknown, revoked or expired API token")
        services.touch_api_token(token=token)
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return "Token"


class ShareLinkAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        key = request.META.get("HTTP_X_GYRE_SHARE") or request.query_params.get("share")
        if not key:
            return None
        link = selectors.active_share_link(key)
        if link is None:
            raise exceptions.AuthenticationFailed("unknown, revoked or expired share link")
        return AnonymousUser(), link
