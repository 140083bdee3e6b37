"""Teams, memberships with roles, hashed API tokens and revocable share links."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Role(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


WRITE_ROLES = frozenset({Role.OWNER, Role.ADMIN, Role.MEMBER})
MANAGE_ROLES = frozenset({Role.OWNER, Role.ADMIN})


class Team(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """The key is shown once at creation; only its SHA-256 digest is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12)  # lets a user tell their tokens apart
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # null: never

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ShareLink(models.Model):
    """Anonymous read-only access to one experiment (and all under it) or one run."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="share_links")
    experiment = models.ForeignKey(
        "runs.Experiment", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    prefix = models.CharField(max_length=12)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # null: never

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(experiment__isnull=False, run__isnull=True)
                | Q(experiment__isnull=True, run__isnull=False),
                name="share_link_one_target",
            )
        ]

    def __str__(self) -> str:
        target = f"run {self.run_id}" if self.run_id else f"experiment {self.experiment_id}"
        return f"share link {self.prefix}… to {target}"


class LoginFailures(models.Model):
    """Failed sign-ins for one key (``user:NAME`` or ``ip:ADDRESS``) in the current window,
    and until when further sign-ins with that key are refused (``teams.lockout``)."""

    key = models.CharField(max_length=200, unique=True)
    failures = models.PositiveIntegerField(default=0)
    window_start = models.DateTimeField()
    locked_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.failures} failed"
