"""A launched run's checkpoints, read from its folder: listed with their step, version,
size, the benchmark at that step and its export's status, and streamed as a tar."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.http import StreamingHttpResponse

from gyre_core.train.checkpoint_dirs import STATE_FILE, checkpoints
from gyre_web.runs.models import BenchmarkScore, CheckpointExport, Run
from gyre_web.runs.paths import run_dir

CHUNK = 1 << 20


def folder(run: Run) -> Path:
    return run_dir(run.pk) / "checkpoints"


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_checkpoints(run: Run) -> list[dict[str, Any]]:
    """Every complete checkpoint of the run, oldest first (a reported run's live on its
    reporter's machine: none here)."""
    scores: dict[int, dict[str, float]] = {}
    for step, suite, score in BenchmarkScore.objects.filter(run=run).values_list(
        "step", "suite", "score"
    ):
        scores.setdefault(step, {})[suite] = score
    exported = {e.version: e.as_message() for e in CheckpointExport.objects.filter(run=run)}
    out = []
    for version, path in checkpoints(folder(run)):
        made = (path / STATE_FILE).stat().st_mtime
        out.append(
            {
                "step": version,  # a checkpoint is named by the version its step produced
                "version": version,
                "size_bytes": _size(path),
                "created_at": datetime.fromtimestamp(made, UTC).isoformat(),
                "benchmark": scores.get(version, {}),
                "export": exported.get(version),  # its Hugging Face export, if asked for
            }
        )
    return out


def find(run: Run, version: int) -> Path | None:
    return next((p for v, p in checkpoints(folder(run)) if v == version), None)


class _Chunks:
    """A write-only file whose writes come back out of :meth:`take`."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def tar_stream(path: Path) -> Iterator[bytes]:
    """``path`` as an uncompressed tar (its folder at the top), a chunk at a time."""
    sink = _Chunks()
    with tarfile.open(fileobj=sink, mode="w|") as tar:  # type: ignore[arg-type]
        for f in sorted(path.rglob("*")):
            if not f.is_file():
                continue
            info = tar.gettarinfo(str(f), arcname=str(Path(path.name) / f.relative_to(path)))
            with f.open("rb") as fh:
                tar.addfile(info, fh)
            yield sink.take()
    yield sink.take()


def tar_response(path: Path, name: str) -> StreamingHttpResponse:
    """``path`` streamed as a tar download named ``name``."""
    response = StreamingHttpResponse(tar_stream(path), content_type="application/x-tar")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
