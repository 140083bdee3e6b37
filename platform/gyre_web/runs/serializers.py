from __future__ import annotations

import re
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gyre_web import redaction
from gyre_web.access import share_link_of
from gyre_web.redaction import public_error
from gyre_web.runs.models import Experiment, Run
from gyre_web.teams.selectors import teams_of

MAX_TAGS = 50
MAX_TAG_LENGTH = 100
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ExperimentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Experiment
        fields = ["id", "team", "name", "description", "tags", "visibility", "created_at"]
        read_only_fields = ["created_at"]

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        request = self.context.get("request")
        fields["team"].queryset = teams_of(getattr(request, "user", None))
        return fields

    def validate_tags(self, tags: Any) -> list[str]:
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise serializers.ValidationError("tags is a list of strings")
        if len(tags) > MAX_TAGS:
            raise serializers.ValidationError(f"at most {MAX_TAGS} tags")
        for tag in tags:
            if len(tag) > MAX_TAG_LENGTH:
                raise serializers.ValidationError(f"a tag is at most {MAX_TAG_LENGTH} characters")
            if _CONTROL.search(tag):
                raise serializers.ValidationError("a tag must not contain control characters")
        return tags


def error_for(serializer: serializers.Serializer, run: Run, error: str) -> str:
    """A run's ``error`` as the caller may read it (``gyre_web.redaction``): the data
    folder hidden for its team; one line without server paths for everyone else (share
    links, outsiders on a public experiment)."""
    if not error:
        return error
    request = serializer.context.get("request")
    if redaction.is_insider(request, run.experiment.team_id, serializer.context):
        return redaction.hide_data_dir(error)
    return public_error(error)


class RunSerializer(serializers.ModelSerializer):
    # Whether the caller may cancel, pause, resume, fork or delete this run (a writer in its
    # team); the dashboard hides those controls otherwise. False for a share link.
    can_edit = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "experiment",
            "name",
            "config",
            "policy",
            "backend",
            "seed",
            "steps",
            "status",
            "step",
            "error",
            "celery_task_id",
            "ray_job_id",
            "parent",
            "stop_requested",
            "created_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "source",
            "reported_seq",
            "can_edit",
        ]
        read_only_fields = [f for f in fields if f not in ("experiment", "name", "config")]

    def get_fields(self) -> dict[str, Any]:
        from gyre_web.runs.selectors import experiments_visible

        fields = super().get_fields()
        request = self.context.get("request")
        fields["experiment"].queryset = experiments_visible(getattr(request, "user", None))
        return fields

    def to_representation(self, instance: Run) -> dict[str, Any]:
        data = super().to_representation(instance)
        if data.get("error"):
            data["error"] = error_for(self, instance, data["error"])
        return data

    def get_can_edit(self, run: Run) -> bool:
        from gyre_web.runs.selectors import experiments_writable

        request = self.context.get("request")
        if request is None or share_link_of(request) is not None:
            return False
        # One query per response, shared by every row of a list (the root's context).
        if "_writable" not in self.context:
            self.context["_writable"] = set(experiments_writable(request.user))
        return run.experiment_id in self.context["_writable"]


class RunListSerializer(RunSerializer):
    class Meta(RunSerializer.Meta):
        fields = [f for f in RunSerializer.Meta.fields if f != "config"]


class ForkSerializer(serializers.Serializer):
    changes = serializers.DictField(required=False, default=dict)
    name = serializers.CharField(required=False, default="", allow_blank=True, max_length=200)


class EventSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    t = serializers.FloatField()
    wall = serializers.DateTimeField()
    data = serializers.JSONField()


# Response shapes of the run actions that answer plain dicts (documentation only).


class EventPageSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    events = EventSerializer(many=True)


class MetricPointSerializer(serializers.Serializer):
    step = serializers.IntegerField(help_text="the bucket's first step")
    last_step = serializers.IntegerField()
    min = serializers.FloatField()
    max = serializers.FloatField()
    last = serializers.FloatField(help_text="the value at last_step")


class MetricSeriesItemSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    name = serializers.CharField()
    points = MetricPointSerializer(many=True)


class MetricSeriesSerializer(serializers.Serializer):
    bucket = serializers.IntegerField(help_text="steps per bucket, on one grid for all runs")
    series = MetricSeriesItemSerializer(many=True)


class RoleUnitSerializer(serializers.Serializer):
    unit = serializers.IntegerField()
    gpus = serializers.IntegerField()


class RoleIntervalSerializer(serializers.Serializer):
    unit = serializers.IntegerField()
    role = serializers.CharField()
    start = serializers.FloatField()
    end = serializers.FloatField(allow_null=True, help_text="null: still in this role")


class RoleTimelineSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    t0 = serializers.FloatField()
    t1 = serializers.FloatField()
    horizon = serializers.FloatField(help_text="the run's clock now")
    units = RoleUnitSerializer(many=True)
    intervals = RoleIntervalSerializer(many=True)
    truncated = serializers.BooleanField(help_text="true: more intervals than limit")
    gpu_seconds = serializers.DictField(child=serializers.FloatField())
    shares = serializers.DictField(child=serializers.FloatField())


@extend_schema_field(OpenApiTypes.BINARY)
class UploadField(serializers.FileField):
    """A file part of a multipart body (documented as binary, not as a URL)."""


class ImportUploadSerializer(serializers.Serializer):
    file = UploadField(help_text="a gyre.trajectory/v1 JSONL file")


class ImportCountsSerializer(serializers.Serializer):
    rollouts = serializers.IntegerField()
    trees = serializers.IntegerField()
    nodes = serializers.IntegerField()


class ImportRejectedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    line = serializers.IntegerField(help_text="the JSONL line (from 1); 0: the whole file")
    field = serializers.CharField(help_text="the refused field; empty: the whole line")


class ReportBatchSerializer(serializers.Serializer):
    first = serializers.IntegerField(
        min_value=1, max_value=2**62, help_text="the reporter's sequence number of events[0]"
    )
    events = serializers.ListField(
        child=serializers.DictField(),
        min_length=1,
        max_length=5000,
        help_text="events as gyre_core writes them: {kind, t, wall, data}",
    )


class ReportAnswerSerializer(serializers.Serializer):
    stored = serializers.IntegerField(help_text="events of the batch stored now (0: resent)")
    next = serializers.IntegerField(help_text="the sequence number the run takes next")
    stop = serializers.CharField(help_text='a stop asked from the web: "", "cancel", "pause"')


class ReportRejectedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    field = serializers.CharField(help_text="the refused field")
    expected = serializers.IntegerField(help_text="the sequence number the run takes next")


class CheckpointSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    version = serializers.IntegerField()
    size_bytes = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    benchmark = serializers.DictField(
        child=serializers.FloatField(), help_text="suite -> score at this step"
    )
    export = serializers.JSONField(
        allow_null=True, help_text="its Hugging Face export (as .../export/ reads it), or null"
    )
