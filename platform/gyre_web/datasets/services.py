"""Dataset writes: an upload checked and stored under a server-chosen name, and removal
(the file goes when its row does, a team's deletion included, once the transaction commits).

A failed upload leaves nothing: the bytes are checked in ``datasets/.incoming/`` and moved
into the team's folder only when they pass, and the moved file is removed again if its row
cannot be written (a staged file a killed process left is removed a day later)."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from gyre_core.data_files import DataFileError as DatasetRejected
from gyre_core.data_files import inspect
from gyre_web.datasets.models import Dataset, Format, Kind, team_folder

log = logging.getLogger(__name__)
__all__ = ["DatasetRejected", "create_dataset", "delete_dataset"]


STALE_SECONDS = 24 * 3600  # a staged upload this old lost its process: removed


def _incoming() -> Path:
    folder = Path(settings.GYRE_DATA_DIR) / "datasets" / ".incoming"
    folder.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - STALE_SECONDS
    for part in folder.glob("*.part"):
        try:
            if part.stat().st_mtime < cutoff:
                part.unlink()
        except OSError:  # another upload removed it first
            pass
    return folder


def _too_large(limit: int) -> DatasetRejected:
    return DatasetRejected("file", f"the file is larger than {limit} bytes")


def _copy_bounded(upload: IO[bytes], path: Path, limit: int) -> tuple[int, str]:
    size, digest = 0, hashlib.sha256()
    with open(path, "xb") as out:
        while chunk := upload.read(2**20):
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            digest.update(chunk)
            out.write(chunk)
    return size, digest.hexdigest()


def create_dataset(
    *, team: Any, name: str, kind: str, upload: IO[bytes], created_by: Any = None
) -> Dataset:
    """Check ``upload`` as a dataset of ``kind`` and keep it for ``team``. Raises
    DatasetRejected (field and problem), and then no file and no row remain."""
    if kind not in Kind.values:
        raise DatasetRejected("kind", f"expected one of {', '.join(Kind.values)}")
    limit = int(settings.GYRE_DATASET_MAX_BYTES)
    if (getattr(upload, "size", None) or 0) > limit:
        raise _too_large(limit)
    token = uuid.uuid4().hex
    staged = _incoming() / f"{token}.part"
    final: Path | None = None
    try:
        size, sha256 = _copy_bounded(upload, staged, limit)
        fmt, rows = inspect(staged, kind, int(settings.GYRE_IMPORT_MAX_LINE_BYTES))
        file_name = f"{token}.{'parquet' if fmt == Format.PARQUET else 'jsonl'}"
        folder = team_folder(team.pk)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / file_name
        staged.replace(final)
        row = Dataset.objects.create(
            team=team,
            name=name,
            kind=kind,
            format=fmt,
            file_name=file_name,
            size=size,
            sha256=sha256,
            rows=rows,
            created_by=created_by,
        )
        final = None  # kept
        return row
    finally:
        staged.unlink(missing_ok=True)
        if final is not None:
            final.unlink(missing_ok=True)


def delete_dataset(*, dataset: Dataset) -> None:
    dataset.delete()  # the file goes on commit (below)


@receiver(post_delete, sender=Dataset, dispatch_uid="gyre-dataset-file")
def _remove_file(sender: Any, instance: Dataset, **kwargs: Any) -> None:
    path = instance.path

    def remove() -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as e:  # a file we cannot remove must not fail the deletion
            log.warning("dataset %s: file not removed: %s", instance.pk, e)

    transaction.on_commit(remove)
