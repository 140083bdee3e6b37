"""Writes for teams, memberships, API tokens and share links."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from gyre_web.teams.models import ApiToken, Membership, Role, ShareLink, Team


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


@transaction.atomic
def set_membership(*, team: Team, user: Any, role: str) -> Membership:
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(Role.values)}")
    membership, _ = Membership.objects.update_or_create(
        team=team, user=user, defaults={"role": role}
    )
    return membership


@transaction.atomic
def remove_membership(*, team: Team, user: Any) -> None:
    owners = Membership.objects.filter(team=team, role=Role.OWNER)
    if owners.count() == 1 and owners.filter(user=user).exists():
        raise ValueError("a team keeps at least one owner")
    Membership.objects.filter(team=team, user=user).delete()


def create_api_token(*, user: Any, name: str) -> tuple[ApiToken, str]:
    """Returns the token and its key; the key is not stored and cannot be shown again."""
    key = _new_key("tok")
    token = ApiToken.objects.create(user=user, name=name, prefix=key[:12], digest=digest_key(key))
    return token, key


def revoke_api_token(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def touch_api_token(*, token: ApiToken) -> None:
    now = timezone.now()
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


def create_share_link(
    *, created_by: Any, experiment: Any = None, run: Any = None
) -> tuple[ShareLink, str]:
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
    )
    return link, key


def revoke_share_link(*, link: ShareLink) -> None:
    ShareLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
