"""Experiments and runs: CRUD, launch on create, cancel/pause/resume/fork, the event log
after a cursor and downsampled metrics for one or several runs."""

from __future__ import annotations

import math
import re
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.db.models import QuerySet
from django.http import Http404, StreamingHttpResponse
from django_filters import rest_framework as filters
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import policy
from gyre_web.access import share_link_of
from gyre_web.cluster import selectors as cluster_selectors
from gyre_web.inputs import int_param
from gyre_web.openapi import ERROR
from gyre_web.runs import checkpoints, reporting, selectors, services
from gyre_web.runs.export_views import CheckpointExportMixin
from gyre_web.runs.log_views import RunLogsMixin
from gyre_web.runs.models import Experiment, Run
from gyre_web.runs.serializers import (
    CheckpointSerializer,
    EventPageSerializer,
    EventSerializer,
    ExperimentSerializer,
    ForkSerializer,
    ImportCountsSerializer,
    ImportRejectedSerializer,
    ImportUploadSerializer,
    MetricSeriesSerializer,
    ReportAnswerSerializer,
    ReportBatchSerializer,
    ReportRejectedSerializer,
    RoleTimelineSerializer,
    RunListSerializer,
    RunSerializer,
)

_KIND = re.compile(r"[a-z0-9_]{1,32}")


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError({name: f"must be a number, got {raw!r}"}) from None
    if not math.isfinite(value) or value < 0:
        raise ValidationError({name: "must be a finite number of seconds, 0 or more"})
    return value


def _query(name: str, kind: Any, help_text: str, required: bool = False) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, required, help_text)


_POINTS = _query("points", int, "at most this many buckets per series (1-10000, default 500)")
_NAMES = _query("names", str, "comma-separated metric names (default: every metric)")
_STATE_CHANGE = extend_schema(request=None, responses={200: RunSerializer, 409: ERROR})
_REPORT_REJECTED = PolymorphicProxySerializer(
    component_name="ReportError",
    serializers=[ReportRejectedSerializer, ERROR],
    resource_type_field_name=None,
)
_IMPORT_REJECTED = PolymorphicProxySerializer(
    component_name="ImportError",
    serializers=[ImportRejectedSerializer, ERROR],
    resource_type_field_name=None,
)


def _config_error(err: services.ConfigInvalid) -> ValidationError:
    return ValidationError({"config": {field: [msg] for field, msg in err.errors}})


class ExperimentFilter(filters.FilterSet):
    tag = filters.CharFilter(method="filter_tag")
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Experiment
        fields = ["team", "visibility", "name"]

    def filter_tag(self, qs: QuerySet[Experiment], name: str, value: str) -> QuerySet[Experiment]:
        # Portable across SQLite and Postgres: match the JSON text of the list.
        return qs.filter(tags__icontains=f'"{value}"')


class ExperimentViewSet(viewsets.ModelViewSet):
    serializer_class = ExperimentSerializer
    filterset_class = ExperimentFilter
    share_link_readable = True

    def get_queryset(self) -> QuerySet[Experiment]:
        return selectors.experiments_visible(self.request.user, share_link_of(self.request))

    def perform_create(self, serializer: Any) -> None:
        policy.require(self.request, serializer.validated_data["team"].pk)
        serializer.save(created_by=self.request.user)

    def perform_update(self, serializer: Any) -> None:
        policy.require(self.request, serializer.instance.team_id)
        if "team" in serializer.validated_data:
            policy.require(self.request, serializer.validated_data["team"].pk)
        serializer.save()

    def perform_destroy(self, instance: Experiment) -> None:
        policy.require(self.request, instance.team_id)
        instance.delete()


class RunFilter(filters.FilterSet):
    team = filters.NumberFilter(field_name="experiment__team")

    class Meta:
        model = Run
        fields = ["experiment", "status", "policy", "backend", "parent"]


class RunViewSet(
    RunLogsMixin,
    CheckpointExportMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    filterset_class = RunFilter
    share_link_readable = True

    def get_queryset(self) -> QuerySet[Run]:
        return selectors.runs_visible(self.request.user, share_link_of(self.request))

    def get_serializer_class(self) -> type[RunSerializer]:
        return RunListSerializer if self.action == "list" else RunSerializer

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self._new_run(request, services.create_run)

    def _new_run(self, request: Request, make: Any) -> Response:
        ser = RunSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        experiment = ser.validated_data["experiment"]
        policy.require(request, experiment.team_id)
        try:
            run = make(
                experiment=experiment,
                config=ser.validated_data["config"],
                name=ser.validated_data.get("name", ""),
                created_by=request.user,
            )
        except services.ConfigInvalid as err:
            raise _config_error(err) from None
        return Response(
            RunSerializer(run, context={"request": request}).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=RunSerializer, responses={201: RunSerializer, 400: ERROR})
    @action(detail=False, methods=["post"], url_path="report", serializer_class=RunSerializer)
    def report(self, request: Request) -> Response:
        """A run that reports from elsewhere (``gyre run CONFIG --report-to URL``): created
        running, never launched; its reporter sends its events to ``report-events``."""
        return self._new_run(request, reporting.create_reported_run)

    @extend_schema(
        request=ReportBatchSerializer,
        responses={200: ReportAnswerSerializer, 400: _REPORT_REJECTED,
                   409: ReportRejectedSerializer},
    )  # fmt: skip
    @action(detail=True, methods=["post"], url_path="report-events", serializer_class=None)
    def report_events(self, request: Request, pk: str | None = None) -> Response:
        """A reported run's next batch of events, numbered by its reporter: a batch sent
        again stores nothing twice; one that skips ahead is refused (409) with the number
        expected. The answer carries any stop asked from the web."""
        run = self.get_object()
        policy.require(request, run.experiment.team_id)
        ser = ReportBatchSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            answer = reporting.ingest(
                run_id=run.pk,
                first=ser.validated_data["first"],
                events=ser.validated_data["events"],
            )
        except reporting.BatchRejected as err:
            body = {"detail": err.problem, "field": err.field, "expected": err.expected}
            return Response(body, status=err.status)
        return Response(answer)

    @extend_schema(responses={204: None, 400: ERROR})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance: Run) -> None:
        policy.require(self.request, instance.experiment.team_id)
        if instance.status in ("queued", "starting", "running"):
            raise ValidationError({"status": "cancel the run before deleting it"})
        instance.delete()

    def _act(self, request: Request, fn: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        policy.require(request, run.experiment.team_id)
        try:
            result = fn(run=run, **kwargs)
        except services.IllegalTransition as err:
            return Response({"detail": str(err)}, status=status.HTTP_409_CONFLICT)
        except services.ConfigInvalid as err:  # a resume under today's rules
            raise _config_error(err) from None
        return Response(RunSerializer(result, context={"request": request}).data)

    @_STATE_CHANGE
    @action(detail=True, methods=["post"], serializer_class=None)
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        return self._act(request, services.request_stop, mode="cancel")

    @_STATE_CHANGE
    @action(detail=True, methods=["post"], serializer_class=None)
    def pause(self, request: Request, pk: str | None = None) -> Response:
        return self._act(request, services.request_stop, mode="pause")

    @extend_schema(request=None, responses={200: RunSerializer, 400: ERROR, 409: ERROR})
    @action(detail=True, methods=["post"], serializer_class=None)
    def resume(self, request: Request, pk: str | None = None) -> Response:
        return self._act(request, services.resume_run, user=request.user)

    @extend_schema(request=ForkSerializer, responses={201: RunSerializer})
    @action(detail=True, methods=["post"], serializer_class=ForkSerializer)
    def fork(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        policy.require(request, run.experiment.team_id)
        ser = ForkSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            child = services.fork_run(
                run=run,
                changes=ser.validated_data["changes"],
                name=ser.validated_data["name"],
                created_by=request.user,
            )
        except services.ConfigInvalid as err:
            raise _config_error(err) from None
        return Response(
            RunSerializer(child, context={"request": request}).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        request={"multipart/form-data": ImportUploadSerializer},
        responses={201: ImportCountsSerializer, 400: _IMPORT_REJECTED},
    )
    @action(
        detail=True,
        methods=["post"],
        url_path="import",
        serializer_class=None,
        parser_classes=[MultiPartParser, FileUploadParser],
    )
    def import_trajectories(self, request: Request, pk: str | None = None) -> Response:
        """Upload a ``gyre.trajectory/v1`` JSONL file (multipart field ``file``); bad input
        is answered 400 with the line and field."""
        from gyre_web.trajectories.imports import ImportRejected, import_trajectories

        run = self.get_object()
        policy.require(request, run.experiment.team_id)
        upload = request.data.get("file")
        if not isinstance(upload, UploadedFile):  # absent, or a plain form field
            raise ValidationError({"file": "attach a gyre.trajectory/v1 JSONL file"})
        try:
            counts = import_trajectories(run=run, upload=upload)
        except ImportRejected as err:
            body = {"detail": err.problem, "line": err.line, "field": err.field}
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        return Response(counts, status=status.HTTP_201_CREATED)

    @extend_schema(responses=CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=None, pagination_class=None)
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        """The run's complete checkpoints, oldest first: step, version, size and the
        benchmark scores at that step (a reported run keeps its own: none here)."""
        run = self.get_object()
        return Response(checkpoints.list_checkpoints(run))

    @extend_schema(
        responses={(200, "application/x-tar"): bytes, 403: ERROR, 404: ERROR},
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"checkpoints/(?P<version>[0-9]{1,12})/download",
        serializer_class=None,
        pagination_class=None,
    )
    def download_checkpoint(
        self, request: Request, pk: str | None = None, version: str = "0"
    ) -> StreamingHttpResponse:
        """One checkpoint's folder as a tar, for the members of the run's team (every
        role; a share link reads the list, not the weights)."""
        run = self.get_object()
        policy.require(request, run.experiment.team_id)
        path = checkpoints.find(run, int(version))
        if path is None:
            raise Http404(f"run {run.pk} has no checkpoint of version {version}")
        return checkpoints.tar_response(path, f"run-{run.pk}-{path.name}.tar")

    @extend_schema(
        responses=EventPageSerializer,
        parameters=[
            _query("after", int, "only the events with seq above this cursor (default 0)"),
            _query("limit", int, "at most this many events (1-10000, default 1000)"),
            _query("kind", str, "comma-separated event kinds (default: every kind)"),
        ],
    )
    @action(detail=True, methods=["get"], serializer_class=EventSerializer, pagination_class=None)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """?after=SEQ&limit=N the events after a cursor; ?kind=a,b only those kinds."""
        run = self.get_object()
        after = int_param(request, "after", 0, 0, 2**62)
        limit = int_param(request, "limit", 1000, 1, 10000)
        kinds = [k for k in request.query_params.get("kind", "").split(",") if k]
        if any(not _KIND.fullmatch(k) for k in kinds):
            raise ValidationError({"kind": "comma-separated event kinds (a-z, 0-9, _)"})
        rows = selectors.events_after(run_id=run.pk, after=after, limit=limit, kinds=kinds)
        return Response({"run": run.pk, "events": [r.as_message() for r in rows]})

    @extend_schema(
        responses=RoleTimelineSerializer,
        parameters=[
            _query("t0", float, "the window's start, seconds on the run's clock (default 0)"),
            _query("t1", float, "the window's end (default: the run's clock now)"),
            _query("limit", int, "at most this many intervals (1-100000, default 20000)"),
        ],
    )
    @action(detail=True, methods=["get"], serializer_class=None, pagination_class=None)
    def roles(self, request: Request, pk: str | None = None) -> Response:
        """The GPU role timeline from the stored role intervals: ?t0=&t1= (seconds on the
        run's clock) a window, ?limit= at most that many intervals (``truncated`` says
        more exist), with GPU-seconds and shares per role over the whole window."""
        run = self.get_object()
        t0, t1 = _float_param(request, "t0"), _float_param(request, "t1")
        if t0 is not None and t1 is not None and t1 < t0:
            raise ValidationError({"t1": "must not be before t0"})
        limit = int_param(request, "limit", 20000, 1, 100000)
        return Response(cluster_selectors.role_intervals(run_id=run.pk, t0=t0, t1=t1, limit=limit))

    @extend_schema(responses=MetricSeriesSerializer, parameters=[_NAMES, _POINTS])
    @action(detail=True, methods=["get"], serializer_class=None, pagination_class=None)
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        return self._metrics(request, [run.pk])

    @extend_schema(
        operation_id="runs_metrics_compare",
        responses={200: MetricSeriesSerializer, 404: ERROR},
        parameters=[_query("runs", str, "comma-separated run ids", required=True), _NAMES, _POINTS],
    )
    @action(
        detail=False,
        methods=["get"],
        url_path="metrics",
        serializer_class=None,
        pagination_class=None,
    )
    def compare_metrics(self, request: Request) -> Response:
        """?runs=1,2,3&names=loss,reward&points=500 — the runs aligned by step."""
        raw = request.query_params.get("runs", "")
        try:
            wanted = [int(x) for x in raw.split(",") if x.strip()]
        except ValueError:
            raise ValidationError({"runs": "a comma-separated list of run ids"}) from None
        if not wanted:
            raise ValidationError({"runs": "name at least one run"})
        visible = list(self.get_queryset().filter(pk__in=wanted).values_list("pk", flat=True))
        missing = sorted(set(wanted) - set(visible))
        if missing:
            return Response({"detail": f"runs not found: {missing}"}, status=404)
        return self._metrics(request, visible)

    def _metrics(self, request: Request, run_ids: list[int]) -> Response:
        points = int_param(request, "points", 500, 1, 10000)
        names = [n for n in request.query_params.get("names", "").split(",") if n]
        names = names or selectors.metric_names(run_ids=run_ids)
        return Response(selectors.metric_series(run_ids=run_ids, names=names, points=points))
