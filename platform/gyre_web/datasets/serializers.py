"""A dataset as answered (no server path: the file is named by id only) and the upload's
multipart body."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from gyre_web.datasets.models import Dataset, Format, Kind
from gyre_web.runs.serializers import UploadField
from gyre_web.teams.models import Team
from gyre_web.teams.selectors import teams_of


class DatasetSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="who uploaded it"
    )
    format = serializers.ChoiceField(
        choices=Format.choices,
        read_only=True,
        help_text="jsonl or parquet (tasks); trajectory or chat_log (trajectories)",
    )
    rows = serializers.IntegerField(
        read_only=True, help_text="tasks, rollouts or conversations in the file"
    )

    class Meta:
        model = Dataset
        fields = [
            "id", "team", "name", "kind", "format", "size", "sha256", "rows",
            "created_by", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class DatasetUploadSerializer(serializers.Serializer):
    file = UploadField(help_text="the data file: JSONL or Parquet (tasks), JSONL (trajectories)")
    name = serializers.CharField(max_length=200, help_text="a label for people")
    kind = serializers.ChoiceField(choices=Kind.choices)
    team = serializers.PrimaryKeyRelatedField(queryset=Team.objects.none())

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None:  # a team the caller is in, or "no such team" (400)
            fields["team"].queryset = teams_of(request.user)
        return fields
