"""Import of ``gyre.trajectory/v1`` JSONL files (from Gyre or another harness) into a run's
rollouts and trees. The token payload kept is the file rewritten from what the reader
parsed: the format's fields only, every unknown key (top level or in a call) dropped, ids,
numbers and tokens as given. Rows hold metadata only (the same rows a live run's payload
makes, see ``payloads``). Text previews show token ids
unless a tokenizer is given (``decode``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import transaction

from gyre_core.config import run_weighting
from gyre_core.trajectory.export import (
    Decode,
    GroupExport,
    TrajectoryFormatError,
    export_group,
    format_fields,
    read_rollouts,
)
from gyre_core.trajectory.export import Rollout as CoreRollout
from gyre_web.trajectories import payloads
from gyre_web.trajectories.models import Rollout, Tree
from gyre_web.trajectories.services import rollout_row, store_tree


class ImportRejected(ValueError):
    """The file cannot be imported; ``line`` and ``field`` locate the problem (0/"" if none)."""

    def __init__(self, problem: str, line: int = 0, field: str = "") -> None:
        super().__init__(f"line {line}: {field}: {problem}" if line else problem)
        self.problem, self.line, self.field = problem, line, field


def import_trajectories(
    *, run: Any, upload: IO[bytes], decode: Decode | None = None
) -> dict[str, int]:
    """Validate and store a JSONL upload; -> counts. Raises ImportRejected, and then
    neither rows nor the file remain (the file is removed on every failed path)."""
    limit = int(settings.GYRE_IMPORT_MAX_BYTES)
    size = getattr(upload, "size", None)
    if size is not None and size > limit:
        raise ImportRejected(f"the file is larger than {limit} bytes", field="file")
    folder = Path(settings.GYRE_RUNS_DIR) / str(run.pk) / "imports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.jsonl"
    staged = path.with_suffix(".part")  # the upload as sent: read, never kept
    stored = False
    try:
        _copy_bounded(upload, staged, limit)
        counts = _import_file(run, staged, path, decode)
        stored = True
        return counts
    finally:
        staged.unlink(missing_ok=True)
        if not stored:
            path.unlink(missing_ok=True)


def _copy_bounded(upload: IO[bytes], path: Path, limit: int) -> None:
    copied = 0
    with open(path, "wb") as out:
        while chunk := upload.read(2**20):
            copied += len(chunk)
            if copied > limit:
                raise ImportRejected(f"the file is larger than {limit} bytes", field="file")
            out.write(chunk)


def _write_known(rollouts: list[CoreRollout], path: Path) -> None:
    with open(path, "x", encoding="utf-8") as out:
        for r in rollouts:
            out.write(json.dumps(format_fields(r), separators=(",", ":")) + "\n")


def _import_file(run: Any, staged: Path, path: Path, decode: Decode | None) -> dict[str, int]:
    try:
        rollouts: list[CoreRollout] = list(
            read_rollouts(staged, max_line_bytes=int(settings.GYRE_IMPORT_MAX_LINE_BYTES))
        )
    except TrajectoryFormatError as err:
        raise ImportRejected(err.problem, err.line, err.field) from None
    if not rollouts:
        raise ImportRejected("the file holds no rollout", field="file")
    known = set(
        Rollout.objects.filter(
            run=run, rollout_id__in=[r.rollout_id for r in rollouts]
        ).values_list("rollout_id", flat=True)
    )
    groups = {r.group_id for r in rollouts}
    known_groups = set(
        Tree.objects.filter(run=run, group_id__in=groups).values_list("group_id", flat=True)
    )
    if known or known_groups:
        dup = sorted(known) or sorted(known_groups)
        raise ImportRejected(f"already imported into this run: {dup[:5]}", field="rollout_id")
    weighting = run_weighting(run.config or {})
    exports: dict[str, GroupExport] = {}
    for group_id in dict.fromkeys(r.group_id for r in rollouts):
        export = export_group(rollouts, group_id, weighting, decode)
        if export is not None:
            exports[group_id] = export
    _write_known(rollouts, path)
    with transaction.atomic():
        Rollout.objects.bulk_create([rollout_row(run.pk, r, path) for r in rollouts])
        nodes = 0
        for group_id, export in exports.items():
            row = Tree.objects.create(run_id=run.pk, group_id=group_id)
            nodes += store_tree(tree_row=row, export=export, payload=path)
    for group_id, export in exports.items():
        payloads.remember_tree(path, group_id, weighting, export.tree)
    return {"rollouts": len(rollouts), "trees": len(exports), "nodes": nodes}
