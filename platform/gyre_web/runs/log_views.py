"""GET /api/runs/{id}/logs/: a run's stored log lines (runtime and worker), searchable,
filtered by level and source, paged by ``seq`` (``after``), or its tail; server paths
shown as ``gyre_web.redaction`` says."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import redaction
from gyre_web.inputs import int_param
from gyre_web.runs import selectors
from gyre_web.runs.logs import LEVELS
from gyre_web.runs.models import LogSource

MAX_Q = 200  # characters of a search


class LogLineSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    time = serializers.DateTimeField()
    source = serializers.ChoiceField(choices=LogSource.values)
    level = serializers.ChoiceField(choices=LEVELS)
    text = serializers.CharField()


class LogPageSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    last_seq = serializers.IntegerField(help_text="the newest line stored (any filter)")
    lines = LogLineSerializer(many=True)


def _q(name: str, kind: Any, help_text: str) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, False, help_text)


def _choice(request: Request, name: str, choices: list[str]) -> str:
    value = request.query_params.get(name, "")
    if value and value not in choices:
        raise ValidationError({name: f"one of {', '.join(choices)}"})
    return value


class RunLogsMixin:
    """The logs action of RunViewSet (readable by whoever reads the run, share links too)."""

    @extend_schema(
        responses=LogPageSerializer,
        parameters=[
            _q("after", int, "only the lines with seq above this cursor (default 0)"),
            _q("limit", int, "at most this many lines (1-5000, default 500)"),
            _q("q", str, f"only the lines containing this text, any case (at most {MAX_Q})"),
            _q("level", str, "only lines of this level or above: debug, info, warning, error"),
            _q("source", str, "only the runtime's or the worker's lines"),
            _q("tail", bool, "true: the last `limit` matching lines instead of the first"),
        ],
    )
    @action(detail=True, methods=["get"], serializer_class=None, pagination_class=None)
    def logs(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()  # type: ignore[attr-defined]
        q = request.query_params.get("q", "")
        if len(q) > MAX_Q or "\x00" in q:
            raise ValidationError({"q": f"at most {MAX_Q} characters, no NUL"})
        tail = request.query_params.get("tail", "")
        if tail not in ("", "true", "false", "1", "0"):
            raise ValidationError({"tail": "true or false"})
        page = selectors.log_lines(
            run_id=run.pk,
            after=int_param(request, "after", 0, 0, 2**62),
            limit=int_param(request, "limit", 500, 1, 5000),
            q=q,
            level=_choice(request, "level", LEVELS),
            source=_choice(request, "source", list(LogSource.values)),
            tail=tail in ("true", "1"),
        )
        team_id, cache = run.experiment.team_id, {}  # server paths: see gyre_web.redaction
        for line in page["lines"]:
            line["text"] = redaction.text_for(request, team_id, line["text"], cache)
        return Response(page)
