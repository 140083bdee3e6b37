from __future__ import annotations

from typing import Any

from rest_framework import serializers

from gyre_web.alerts.models import ENDINGS, Delivery, Webhook
from gyre_web.teams.models import Team
from gyre_web.teams.selectors import teams_of


class WebhookSerializer(serializers.ModelSerializer):
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=ENDINGS),
        min_length=1,
        max_length=len(ENDINGS),
        help_text="the run endings that call it",
    )
    url = serializers.URLField(max_length=500, help_text="http(s) URL the JSON is posted to")

    class Meta:
        model = Webhook
        fields = ["id", "team", "name", "url", "events", "created_at"]
        read_only_fields = ["id", "created_at"]

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None:  # a team the caller is in, or "no such team" (400)
            fields["team"].queryset = teams_of(request.user)
        else:
            fields["team"].queryset = Team.objects.none()
        return fields

    def validate_url(self, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise serializers.ValidationError("an http:// or https:// URL")
        return value  # its address is checked once the caller may register (net.check)


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = Delivery
        fields = [
            "id", "run", "event", "state", "attempts", "last_result", "last_error",
            "created_at", "next_attempt_at", "delivered_at", "body",
        ]  # fmt: skip
        read_only_fields = fields
