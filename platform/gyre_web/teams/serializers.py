from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework import serializers

from gyre_web.teams.models import ApiToken, Membership, Role, ShareLink, Team


class TeamSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "created_at", "role"]
        read_only_fields = ["created_at", "role"]
        extra_kwargs = {"slug": {"required": False}}

    def get_role(self, team: Team) -> str | None:
        user = self.context["request"].user
        for m in team.memberships.all():
            if m.user_id == user.pk:
                return m.role
        return None


class UsernameField(serializers.SlugRelatedField):
    """A user by username; a name Postgres cannot hold (a NUL byte) is simply not found."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data.replace("\x00", ""))
        return super().to_internal_value(data)


class MembershipSerializer(serializers.ModelSerializer):
    username = UsernameField(
        source="user", slug_field="username", queryset=get_user_model().objects.all()
    )
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["id", "username", "role", "created_at"]
        read_only_fields = ["created_at"]


def checked_expiry(value: datetime | None, ttl_days: float, setting: str) -> datetime | None:
    """An expiry asked at creation: in the future, and within the operator's lifetime."""
    if value is None:
        return None
    now = timezone.now()
    if value <= now:
        raise serializers.ValidationError("must be in the future")
    if ttl_days > 0 and value > now + timedelta(days=ttl_days):
        raise serializers.ValidationError(f"at most {ttl_days:g} days from now ({setting})")
    return value


_EXPIRES_HELP = "when it stops working (null: never); default: the operator's lifetime"


class ApiTokenSerializer(serializers.ModelSerializer):
    expires_at = serializers.DateTimeField(required=False, allow_null=True, help_text=_EXPIRES_HELP)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at", "expires_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        return checked_expiry(value, settings.GYRE_TOKEN_TTL_DAYS, "GYRE_TOKEN_TTL_DAYS")


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    key = serializers.CharField(read_only=True, help_text="the token's key, shown only once")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]


class ShareLinkSerializer(serializers.ModelSerializer):
    expires_at = serializers.DateTimeField(required=False, allow_null=True, help_text=_EXPIRES_HELP)

    class Meta:
        model = ShareLink
        fields = [
            "id", "team", "experiment", "run", "prefix", "created_at", "revoked_at", "expires_at"
        ]  # fmt: skip
        read_only_fields = ["team", "prefix", "created_at", "revoked_at"]

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        return checked_expiry(value, settings.GYRE_SHARE_TTL_DAYS, "GYRE_SHARE_TTL_DAYS")

    def get_fields(self):  # type: ignore[no-untyped-def]
        from gyre_web.runs.selectors import experiments_visible, runs_visible

        fields = super().get_fields()
        request = self.context.get("request")
        user = getattr(request, "user", None)
        fields["experiment"] = serializers.PrimaryKeyRelatedField(
            queryset=experiments_visible(user), required=False, allow_null=True
        )
        fields["run"] = serializers.PrimaryKeyRelatedField(
            queryset=runs_visible(user), required=False, allow_null=True
        )
        return fields

    def validate(self, attrs: dict) -> dict:  # type: ignore[type-arg]
        if (attrs.get("experiment") is None) == (attrs.get("run") is None):
            raise serializers.ValidationError(
                {"experiment": "give exactly one of experiment or run"}
            )
        return attrs


class ShareLinkCreatedSerializer(ShareLinkSerializer):
    key = serializers.CharField(read_only=True, help_text="the link's key, shown only once")

    class Meta(ShareLinkSerializer.Meta):
        fields = [*ShareLinkSerializer.Meta.fields, "key"]


class SessionSerializer(serializers.Serializer):
    """Who the caller is: signed in or not, and as whom."""

    authenticated = serializers.BooleanField(help_text="true for a signed-in user")
    username = serializers.CharField(allow_null=True, help_text="null when not signed in")
    staff = serializers.BooleanField(help_text="a site administrator")
