"""Where a run's files live on the server: its working folder (events' payload files,
checkpoints, logs) and its checkpoint exports."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


def run_dir(run_id: int) -> Path:
    return Path(settings.GYRE_RUNS_DIR) / str(run_id)


def export_dir(run_id: int, version: int) -> Path:
    return run_dir(run_id) / "exports" / f"hf-step-{version:08d}"
