"""Websocket authentication: the session cookie, or ``?token=KEY`` (API token), or
``?share=KEY`` (share link, read-only to its experiment or run). The scope keeps which
credential it was (``api_token``: the token's id, ``share_link``: the link) so that the
consumer can re-check it while the socket stays open."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async

from gyre_web.teams import selectors, services


@database_sync_to_async
def _from_keys(token: str, share: str) -> tuple[Any, Any, int | None]:
    if token:
        found = selectors.active_token(token)
        if found is not None:
            services.touch_api_token(token=found)
            return found.user, None, found.pk
    if share:
        return None, selectors.active_share_link(share), None
    return None, None, None


class _KeyMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        query = parse_qs(scope.get("query_string", b"").decode())
        token, share = query.get("token", [""])[0], query.get("share", [""])[0]
        scope = dict(scope)
        scope["share_link"] = None
        scope["api_token"] = None
        if token or share:
            user, link, token_id = await _from_keys(token, share)
            if user is not None:
                scope["user"] = user
            scope["share_link"] = link
            scope["api_token"] = token_id
        return await self.inner(scope, receive, send)


def WebsocketAuthMiddleware(inner: Any) -> Any:
    return AuthMiddlewareStack(_KeyMiddleware(inner))
