"""Failed sign-in limit on every password login (DRF's /api/auth/login/ used by the
dashboard, the admin's /admin/login/: all go through ``django.contrib.auth.authenticate``).

``GYRE_LOGIN_MAX_FAILURES`` failures for one username (``GYRE_LOGIN_MAX_FAILURES_PER_IP``
for one client address) within ``GYRE_LOGIN_WINDOW_SECONDS`` lock it for
``GYRE_LOGIN_LOCK_SECONDS``: while locked, :class:`LockoutBackend` (first in
AUTHENTICATION_BACKENDS) stops ``authenticate`` before the password is even checked, so
the right password is refused too, and :class:`LoginLockoutMiddleware` answers 429 JSON
with ``Retry-After``. A successful sign-in clears the username's count. The counts live
in the database (``LoginFailures``), so every process and both modes share them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import BaseBackend
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse

from gyre_web.teams import selectors, services

LOCKED = "gyre_login_retry_after"  # request attribute: seconds until sign-in reopens


def _user_key(username: Any) -> str:
    return "user:" + str(username or "").strip().lower()[:150]


def _limits(request: Any, username: Any) -> list[tuple[str, int]]:
    """(key, failures that lock it) for the username and the client address."""
    limits = [(_user_key(username), int(settings.GYRE_LOGIN_MAX_FAILURES))]
    address = getattr(request, "META", {}).get("REMOTE_ADDR")
    if address:
        limits.append(("ip:" + address, int(settings.GYRE_LOGIN_MAX_FAILURES_PER_IP)))
    return [(key, limit) for key, limit in limits if limit > 0]


class LockoutBackend(BaseBackend):
    """Authenticates nobody; refuses every sign-in while its username or address is locked."""

    def authenticate(self, request: Any, username: Any = None, **credentials: Any) -> None:
        if request is None:
            return None
        keys = [key for key, _ in _limits(request, username)]
        wait = selectors.login_locked_for(keys=keys) if keys else 0.0
        if wait > 0:
            setattr(request, LOCKED, max(1, math.ceil(wait)))
            raise PermissionDenied("too many failed sign-ins")  # stops authenticate()
        return None


@receiver(user_login_failed)
def _count_failure(sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any) -> None:
    if request is None or hasattr(request, LOCKED):
        return  # no client to count, or refused while locked (not a new failure)
    for key, limit in _limits(request, credentials.get("username")):
        services.record_login_failure(
            key=key,
            limit=limit,
            window_s=float(settings.GYRE_LOGIN_WINDOW_SECONDS),
            lock_s=float(settings.GYRE_LOGIN_LOCK_SECONDS),
        )


@receiver(user_logged_in)
def _clear_failures(sender: Any, request: Any, user: Any, **_: Any) -> None:
    services.clear_login_failures(key=_user_key(user.get_username()))


class LoginLockoutMiddleware:
    """Turns a sign-in refused while locked into 429 JSON naming the field."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        wait = getattr(request, LOCKED, None)
        if wait is None:
            return response
        message = f"too many failed sign-ins; try again in {wait} s"
        locked = JsonResponse(
            {"username": [message], "detail": message, "retry_after": wait}, status=429
        )
        locked["Retry-After"] = str(wait)
        return locked
