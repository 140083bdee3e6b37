"""Token payload files (``gyre.trajectory/v1``) and the tokenizer kept beside them.

A live run's step file is copied into ``GYRE_DATA_DIR/payloads/<run>/`` (named by its
content hash), so it outlives the run's work folder; the trees of that step's groups read
their tokens from it. The run's ``tokenizer.json`` is kept there too. ``payload_tree`` is a group's weighed tree read back from its file, kept in a
small in-process LRU (``remember_tree`` puts in the tree an import just built), so a
payload's tree is built once per process for its node rows and its token views.

This module holds files only: the rows are written by ``services`` and ``imports``, and
what a tree shows is ``gyre_core.trajectory.export``'s.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings

from gyre_core.trajectory.export import (
    Decode,
    PrefixTree,
    Weighting,
    read_rollouts,
)

log = logging.getLogger(__name__)
TOKENIZER_FILE = "tokenizer.json"
TREES_KEPT = 8  # weighed trees the LRU holds (a tree browser clicks through one at a time)


def payload_folder(run_id: int) -> Path:
    return Path(settings.GYRE_DATA_DIR) / "payloads" / str(run_id)


# --------------------------------------------------------------------------- payload files


def keep_copy(run_id: int, source: Path) -> Path:
    """Copy ``source`` into the run's payload folder under a content-hashed name (a
    redelivered file lands on the same copy; a rewritten one gets its own)."""
    digest = hashlib.sha256()
    with open(source, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    folder = payload_folder(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{_safe(source.stem)}-{digest.hexdigest()[:16]}.jsonl"
    if not dest.exists():
        tmp = dest.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(dest)
    return dest


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80] or "group"


# --------------------------------------------------------------------------- weighed trees

_TreeKey = tuple[str, str, int, Weighting]
_trees: OrderedDict[_TreeKey, PrefixTree | None] = OrderedDict()
_trees_lock = threading.Lock()


def _tree_key(path: Path, group_id: str, weighting: Weighting) -> _TreeKey:
    return (str(path), group_id, path.stat().st_mtime_ns, weighting)


def remember_tree(path: Path, group_id: str, weighting: Weighting, tree: PrefixTree) -> None:
    """Keep the tree just built from ``path`` for the token views that follow."""
    _keep(_tree_key(path, group_id, weighting), tree)


def payload_tree(path: Path, group_id: str, weighting: Weighting) -> PrefixTree | None:
    """The group's tree in ``path``, weighed with ``weighting`` (None: the file holds no
    rollout of the group). Raises OSError or TrajectoryFormatError for an unreadable file."""
    key = _tree_key(path, group_id, weighting)
    with _trees_lock:
        if key in _trees:
            _trees.move_to_end(key)
            return _trees[key]
    rollouts = (r for r in read_rollouts(path) if r.group_id == group_id)
    tree = weighting.trees(rollouts).get(group_id)
    _keep(key, tree)
    return tree


def _keep(key: _TreeKey, tree: PrefixTree | None) -> None:
    with _trees_lock:
        _trees[key] = tree
        _trees.move_to_end(key)
        while len(_trees) > TREES_KEPT:
            _trees.popitem(last=False)


# --------------------------------------------------------------------------- tokenizer


def _model_tokenizer(run: Any) -> Path | None:
    """The tokenizer of the run's model: the checkpoint it started from (as the platform's
    rules resolve it: ``config_policy.model_folder``), or the tiny model the real runtime
    builds in the run's work folder."""
    from gyre_web.runs.config_policy import model_folder

    checkpoint = model_folder(run)
    folder = (
        Path(checkpoint) if checkpoint else Path(settings.GYRE_RUNS_DIR) / str(run.pk) / "model"
    )
    path = folder / TOKENIZER_FILE
    return path if path.is_file() else None


def tokenizer_path(*, run_id: int) -> Path | None:
    """The copy kept with the payloads first (it outlives the work folder), then the model's."""
    kept = payload_folder(run_id) / TOKENIZER_FILE
    if kept.is_file():
        return kept
    from gyre_web.runs.models import Run

    run = Run.objects.select_related("experiment").filter(pk=run_id).first()
    if run is None or run.backend != "real":
        return None  # a simulated run or an import: its tokens have no tokenizer here
    return _model_tokenizer(run)


def save_tokenizer(*, run_id: int) -> None:
    """Keep the run's tokenizer beside its payloads (once)."""
    kept = payload_folder(run_id) / TOKENIZER_FILE
    source = None if kept.is_file() else tokenizer_path(run_id=run_id)
    if source is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(kept)


@lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int) -> Any:
    import tokenizers

    return tokenizers.Tokenizer.from_file(path)


def load_tokenizer(path: Path | None) -> Any:
    """The ``tokenizers.Tokenizer`` in ``path``; None without one, or for a file this
    library cannot read (ids are shown then)."""
    if path is None:
        return None
    try:
        return _tokenizer(str(path), path.stat().st_mtime_ns)
    except Exception:  # a tokenizer file this library cannot read: show ids
        return None


def run_decoder(*, run_id: int) -> Decode | None:
    tok = load_tokenizer(tokenizer_path(run_id=run_id))
    if tok is None:
        return None
    return lambda ids: str(tok.decode(ids, skip_special_tokens=False))
