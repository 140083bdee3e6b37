"""A run checkpoint exported as a Hugging Face directory from the page:
POST /api/runs/{id}/checkpoints/{version}/export/ (owners, admins and members) queues it,
GET the same path reads its status, GET .../export/download/ streams the directory as a
tar once done (every team role). Share links are refused on all three."""

from __future__ import annotations

from typing import Any

from django.http import Http404, StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web import policy
from gyre_web.openapi import ERROR
from gyre_web.redaction import hide_data_dir
from gyre_web.runs import checkpoints, exports
from gyre_web.runs.models import CheckpointExport, ExportStatus, Run

EXPORT_PATH = r"checkpoints/(?P<version>[0-9]{1,12})/export"


class ExportSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    status = serializers.ChoiceField(choices=ExportStatus.values)
    error = serializers.CharField(help_text="why it failed ('' unless failed)")
    size_bytes = serializers.IntegerField(help_text="the directory's size once done")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


def _export_of(run: Run, version: str) -> CheckpointExport:
    export = CheckpointExport.objects.filter(run=run, version=int(version)).first()
    if export is None:
        raise Http404(f"checkpoint {version} of run {run.pk} was not exported")
    return export


def _shown(export: CheckpointExport) -> dict[str, Any]:
    """Read by the run's team only: its error with the data folder hidden."""
    return {**export.as_message(), "error": hide_data_dir(export.error)}


class CheckpointExportMixin:
    """The export actions of RunViewSet."""

    @extend_schema(request=None, responses={202: ExportSerializer, 403: ERROR, 404: ERROR})
    @action(
        detail=True,
        methods=["post"],
        url_path=EXPORT_PATH,
        serializer_class=None,
        pagination_class=None,
    )
    def export_checkpoint(
        self, request: Request, pk: str | None = None, version: str = "0"
    ) -> Response:
        """Queue the checkpoint's export (a done, queued or running one is answered as it
        stands; a failed one is queued again)."""
        run = self.get_object()  # type: ignore[attr-defined]
        policy.require(request, run.experiment.team_id)
        if checkpoints.find(run, int(version)) is None:
            raise Http404(f"run {run.pk} has no checkpoint of version {version}")
        export = exports.request_export(run=run, version=int(version), created_by=request.user)
        return Response(_shown(export), status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: ExportSerializer, 403: ERROR, 404: ERROR})
    @export_checkpoint.mapping.get
    def export_status(
        self, request: Request, pk: str | None = None, version: str = "0"
    ) -> Response:
        run = self.get_object()  # type: ignore[attr-defined]
        policy.require(request, run.experiment.team_id)
        return Response(_shown(_export_of(run, version)))

    @extend_schema(responses={(200, "application/x-tar"): bytes, 403: ERROR, 404: ERROR})
    @action(
        detail=True,
        methods=["get"],
        url_path=EXPORT_PATH + "/download",
        serializer_class=None,
        pagination_class=None,
    )
    def download_export(
        self, request: Request, pk: str | None = None, version: str = "0"
    ) -> StreamingHttpResponse:
        """The exported directory as a tar (``hf-step-<version>/`` at its top)."""
        run = self.get_object()  # type: ignore[attr-defined]
        policy.require(request, run.experiment.team_id)
        export = _export_of(run, version)
        path = exports.export_dir(run.pk, export.version)
        if export.status != ExportStatus.DONE or not path.is_dir():
            raise Http404(f"the export of checkpoint {version} is {export.status}, not done")
        return checkpoints.tar_response(path, f"run-{run.pk}-{path.name}.tar")
