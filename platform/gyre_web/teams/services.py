"""Writes for teams, memberships, API tokens and share links."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from gyre_web.teams.models import ApiToken, LoginFailures, Membership, Role, ShareLink, Team
from gyre_web.wake import wake

ACCESS_GROUP = "access"  # every websocket consumer listens here (service mode)


def access_changed() -> None:
    """After the commit, tell every websocket consumer to re-check its credentials and
    subscriptions now (they also re-check on an interval, which covers embedded mode and
    a lost notice)."""
    transaction.on_commit(_broadcast_access_changed)


def _broadcast_access_changed() -> None:
    wake(ACCESS_GROUP, {"type": "access.changed"})


def digest_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _new_key(kind: str) -> str:
    return f"gyre_{kind}_{secrets.token_urlsafe(32)}"


class SlugTaken(ValueError):
    """An explicitly given team slug that another team has."""


@transaction.atomic
def create_team(*, name: str, owner: Any, slug: str = "") -> Team:
    """A team with ``slug``, or one derived from its name: ``slugify(name)`` (``team`` when
    that is empty, as for ``"???"``) with ``-2``, ``-3``, ... until it is free. Two
    concurrent creations cannot take one slug: the loser of the unique index retries."""
    base = slug or (slugify(name)[:90] or "team")
    taken = set(Team.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    for _ in range(5):
        candidate = base
        n = 1
        while candidate in taken:
            if slug:
                raise SlugTaken(f"a team with slug {slug!r} exists")
            n += 1
            candidate = f"{base}-{n}"
        try:
            with transaction.atomic():  # a savepoint: a lost race leaves the outer intact
                team = Team.objects.create(name=name, slug=candidate)
        except IntegrityError:
            taken.add(candidate)
            continue
        Membership.objects.create(team=team, user=owner, role=Role.OWNER)
        return team
    raise SlugTaken("no free slug for this name; give one")


RANK: dict[str, int] = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


class MembershipRefused(Exception):
    """A membership change the acting user may not make; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class LastOwner(MembershipRefused, ValueError):
    """The change would leave the team without an owner."""


def _lock_roles(team: Team, by: Any) -> tuple[str | None, dict[int, str]]:
    """Lock the team (membership changes of one team run one at a time, so two owners
    demoting each other cannot leave none) and read the actor's role and every role."""
    Team.objects.select_for_update().filter(pk=team.pk).first()
    roles = dict(Membership.objects.filter(team=team).values_list("user_id", "role"))
    return (roles.get(by.pk) if by is not None else None), roles


def _cannot(actor: str | None, what: str) -> str:
    return f"your role in this team ({actor or 'none'}) cannot {what}"


def _owners(roles: dict[int, str]) -> int:
    return sum(1 for r in roles.values() if r == Role.OWNER)


@transaction.atomic
def set_membership(*, team: Team, user: Any, role: str, by: Any = None) -> Membership:
    """Add ``user`` to ``team`` or change their role, as ``by`` (``None``: the system, e.g.
    seeding, which skips the permission rules but not the last-owner rule).

    A team always keeps an owner; only an owner grants the owner role or changes an
    owner's role; an admin manages admin, member and viewer memberships; nobody raises
    their own role."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(Role.values)}")
    actor, roles = _lock_roles(team, by)
    current = roles.get(user.pk)
    if by is not None:
        if actor not in (Role.OWNER, Role.ADMIN):
            raise MembershipRefused("role", _cannot(actor, "manage members"))
        if user.pk == by.pk and (current is None or RANK[role] > RANK[current]):
            raise MembershipRefused("role", "nobody raises their own role")
        if Role.OWNER in (role, current) and actor != Role.OWNER:
            what = "grant the owner role" if role == Role.OWNER else "change an owner's role"
            raise MembershipRefused("role", f"only an owner may {what}")
    if current == Role.OWNER and role != Role.OWNER and _owners(roles) == 1:
        raise LastOwner("role", "a team keeps at least one owner: make another owner first")
    membership, _ = Membership.objects.update_or_create(
        team=team, user=user, defaults={"role": role}
    )
    access_changed()
    return membership


@transaction.atomic
def remove_membership(*, team: Team, user: Any, by: Any = None) -> None:
    """Remove ``user`` from ``team`` as ``by`` (anyone may leave; an admin removes admins,
    members and viewers; only an owner removes an owner; the last owner stays)."""
    actor, roles = _lock_roles(team, by)
    current = roles.get(user.pk)
    if by is not None and user.pk != by.pk:
        if actor not in (Role.OWNER, Role.ADMIN):
            raise MembershipRefused("username", _cannot(actor, "remove members"))
        if current == Role.OWNER and actor != Role.OWNER:
            raise MembershipRefused("username", "only an owner may remove an owner")
    if current == Role.OWNER and _owners(roles) == 1:
        raise LastOwner("username", "a team keeps at least one owner: make another owner first")
    Membership.objects.filter(team=team, user=user).delete()
    access_changed()


@transaction.atomic
def delete_team(*, team: Team) -> None:
    team.delete()
    access_changed()


def expiry(requested: datetime | None, ttl_days: float) -> datetime | None:
    """When a new token or link expires: ``requested`` if given (the caller checked it is
    in the future and within the lifetime), else ``ttl_days`` from now (0: never)."""
    if requested is not None:
        return requested
    return timezone.now() + timedelta(days=ttl_days) if ttl_days > 0 else None


def create_api_token(
    *, user: Any, name: str, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Returns the token and its key; the key is not stored and cannot be shown again.
    It expires at ``expires_at``, else after GYRE_TOKEN_TTL_DAYS (0: never)."""
    key = _new_key("tok")
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=key[:12],
        digest=digest_key(key),
        expires_at=expiry(expires_at, settings.GYRE_TOKEN_TTL_DAYS),
    )
    return token, key


def revoke_api_token(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    access_changed()


def touch_api_token(*, token: ApiToken) -> None:
    now = timezone.now()
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


def create_share_link(
    *,
    created_by: Any,
    experiment: Any = None,
    run: Any = None,
    expires_at: datetime | None = None,
) -> tuple[ShareLink, str]:
    """Returns the link and its key (shown once). It expires at ``expires_at``, else after
    GYRE_SHARE_TTL_DAYS (0: never)."""
    if (experiment is None) == (run is None):
        raise ValueError("a share link points to exactly one experiment or one run")
    team = (experiment or run.experiment).team
    key = _new_key("share")
    link = ShareLink.objects.create(
        team=team,
        experiment=experiment,
        run=run,
        prefix=key[:12],
        digest=digest_key(key),
        created_by=created_by,
        expires_at=expiry(expires_at, settings.GYRE_SHARE_TTL_DAYS),
    )
    return link, key


def revoke_share_link(*, link: ShareLink) -> None:
    ShareLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    access_changed()


@transaction.atomic
def record_login_failure(*, key: str, limit: int, window_s: float, lock_s: float) -> bool:
    """Count one failed sign-in for ``key``; the ``limit``-th within ``window_s`` seconds
    locks the key for ``lock_s`` seconds (and starts a new count). True if it locked."""
    now = timezone.now()
    stale = now - timedelta(seconds=max(window_s, lock_s))
    LoginFailures.objects.filter(window_start__lt=stale, locked_until__isnull=True).delete()
    LoginFailures.objects.filter(window_start__lt=stale, locked_until__lt=now).delete()
    row, _ = LoginFailures.objects.select_for_update().get_or_create(
        key=key, defaults={"window_start": now}
    )
    if row.window_start < now - timedelta(seconds=window_s):
        row.failures, row.window_start = 0, now
    row.failures += 1
    locked = row.failures >= limit
    if locked:
        row.failures, row.window_start = 0, now
        row.locked_until = now + timedelta(seconds=lock_s)
    row.save()
    return locked


def clear_login_failures(*, key: str) -> None:
    LoginFailures.objects.filter(key=key).delete()
