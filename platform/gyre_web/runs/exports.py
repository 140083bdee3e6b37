"""Writes for checkpoint exports (``CheckpointExport``): a team member asks for a run
checkpoint as a Hugging Face model directory; a worker task (``workers.tasks.
export_checkpoint``) runs ``gyre export`` in a subprocess (it imports torch, which the web
never does) into ``<run folder>/exports/hf-step-<version>`` and records the outcome:
queued -> running -> done | failed (with the error). Asking again after a failure queues
it again; a queued, running or done export is answered as it stands."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from gyre_web import queue
from gyre_web.runs.models import CheckpointExport, ExportStatus, Run
from gyre_web.runs.paths import export_dir

TASK = "workers.tasks.export_checkpoint"


def request_export(*, run: Run, version: int, created_by: Any = None) -> CheckpointExport:
    """The checkpoint's export, queued (sent on commit) unless one is queued, running or
    done already."""
    with transaction.atomic():
        row, made = CheckpointExport.objects.select_for_update().get_or_create(
            run=run, version=version, defaults={"created_by": created_by}
        )
        if not made and row.status != ExportStatus.FAILED:
            return row
        row.status, row.error, row.size_bytes, row.finished_at = ExportStatus.QUEUED, "", 0, None
        row.task_id, row.created_by = str(uuid.uuid4()), created_by
        row.save()
        export_id, task_id = row.pk, row.task_id
        transaction.on_commit(lambda: _send(export_id, task_id))
    return row


def _send(export_id: int, task_id: str) -> None:
    try:
        queue.send_task(TASK, args=[export_id], task_id=task_id)
    except Exception as err:  # the broker is away: asking again retries
        finish_export(export_id=export_id, error=f"could not queue the export: {err}")


@transaction.atomic
def claim_export(*, export_id: int) -> dict[str, str] | None:
    """queued -> running; -> the checkpoint, model folder and output paths, or None when
    the export is not queued (a message delivered twice) or its checkpoint is gone."""
    from gyre_web.runs.checkpoints import find

    row = CheckpointExport.objects.select_for_update().select_related("run").filter(pk=export_id)
    export = row.first()
    if export is None or export.status != ExportStatus.QUEUED:
        return None
    checkpoint = find(export.run, export.version)
    if checkpoint is None:
        _finish(export, error=f"the run has no checkpoint of version {export.version}")
        return None
    export.status = ExportStatus.RUNNING
    export.save(update_fields=["status"])
    model = checkpoint.parent.parent / "model"  # the run's own model folder, where it made one
    if not (model / "config.json").is_file():  # else the model it started from
        from gyre_web.runs.config_policy import model_folder

        model = Path(model_folder(export.run) or model)
    return {
        "checkpoint": str(checkpoint),
        "model": str(model),
        "out": str(export_dir(export.run_id, export.version)),
        "run_folder": str(checkpoint.parent.parent),
    }


def finish_export(*, export_id: int, error: str = "", size_bytes: int = 0) -> None:
    with transaction.atomic():
        export = CheckpointExport.objects.select_for_update().filter(pk=export_id).first()
        if export is not None:
            _finish(export, error=error, size_bytes=size_bytes)


def _finish(export: CheckpointExport, *, error: str = "", size_bytes: int = 0) -> None:
    export.status = ExportStatus.FAILED if error else ExportStatus.DONE
    export.error, export.size_bytes, export.finished_at = error[:2000], size_bytes, timezone.now()
    export.save(update_fields=["status", "error", "size_bytes", "finished_at"])
    if error:
        shutil.rmtree(export_dir(export.run_id, export.version), ignore_errors=True)
