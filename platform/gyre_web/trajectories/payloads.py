"""Token payload files: the ``gyre.trajectory/v1`` records behind a run's rollouts and trees.

Both an upload (``imports``) and a live run (the ``rollouts_written`` event) end in the
same rows: one Rollout per record, one Tree per group with its nodes (spans, previews,
advantages), ``payload_path`` naming the file that holds the tokens. A live run's file is
copied into ``GYRE_DATA_DIR/payloads/<run>/`` (named by its content hash), so it outlives
the run's work folder; the per-token view (``node_tokens``) reads it back from there.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction

from gyre_core.events import storable_text
from gyre_core.trajectory.format import Rollout as CoreRollout
from gyre_core.trajectory.format import TrajectoryFormatError, read_rollouts
from gyre_core.trajectory.rewards import assign_weights
from gyre_core.trajectory.tree import Node, PrefixTree, build_trees
from gyre_core.trajectory.writer import write_rollouts
from gyre_web.trajectories.models import Rollout, Tree
from gyre_web.trajectories.services import store_nodes

log = logging.getLogger(__name__)
PREVIEW_TOKENS = 24  # tokens shown in a node's preview
Decode = Callable[[list[int]], str]


def payload_folder(run_id: int) -> Path:
    return Path(settings.GYRE_DATA_DIR) / "payloads" / str(run_id)


# --------------------------------------------------------------------------- rows from a file


def ids_preview(tokens: Any) -> str:
    ids = [int(t) for t in tokens[:PREVIEW_TOKENS]]
    more = " …" if len(tokens) > PREVIEW_TOKENS else ""
    return "[" + " ".join(map(str, ids)) + more + "]"


def node_advantage(node: Node) -> float | None:
    """The mean loss weight (``once`` mode: the mean advantage of the rollouts that
    generated each token) over the node's generated tokens; None when it has none."""
    if not node.generated.any():
        return None
    return round(float(np.mean(node.weight[node.generated])), 6)


def node_specs(tree: PrefixTree, decode: Decode | None) -> list[dict[str, Any]]:
    """Preorder (parent before child, children in the tree's own order) node dicts for
    ``store_nodes``; the child order is what ``node_tokens`` walks back by path key."""
    assign_weights(tree)  # the trainer's default: once, group mean baseline
    specs: list[dict[str, Any]] = []
    ids: dict[int, int] = {}

    def leaves(node: Node) -> int:
        return sum(leaves(c) for c in node.children.values()) if node.children else 1

    stack = list(reversed(list(tree.root.children.values())))
    while stack:
        node = stack.pop()
        ids[id(node)] = len(specs)
        parent = node.parent
        opener = tree.calls[node.opener] if node.opener >= 0 else None
        head = [int(t) for t in node.tokens[:PREVIEW_TOKENS]]
        specs.append(
            {
                "id": len(specs),
                "parent": None if parent is None or parent is tree.root else ids[id(parent)],
                "kind": opener.kind if opener else "continue",
                "token_start": node.start,
                "token_end": node.end,
                "trainable": int(node.generated.sum()),
                # a token may decode to NUL, which PostgreSQL text refuses: shown as ␀
                "preview": storable_text(decode(head)) if decode else ids_preview(node.tokens),
                "advantage": node_advantage(node),
                "leaves": leaves(node),
            }
        )
        stack.extend(reversed(list(node.children.values())))
    return specs


def rollout_row(run_id: int, r: CoreRollout, path: Path) -> Rollout:
    versions = [int(v) for c in r.calls for v in c.versions]
    return Rollout(
        run_id=run_id,
        rollout_id=r.rollout_id,
        task_id=r.task_id,
        group_id=r.group_id,
        status=r.status,
        progress=r.progress,
        reward=r.score,
        turns=sum(1 for c in r.calls if c.agent == "main"),
        tokens=sum(len(c.completion_ids) for c in r.calls),
        version_min=min(versions) if versions else None,
        version_max=max(versions) if versions else None,
        payload_path=str(path),
    )


def store_tree(
    *, tree_row: Tree, tree: PrefixTree, payload: Path, decode: Decode | None
) -> list[dict[str, Any]]:
    """(Re)write a Tree row's nodes and counts from the in-memory tree of its payload."""
    specs = node_specs(tree, decode)
    store_nodes(tree=tree_row, nodes=specs)
    tree_row.rollouts = len(tree.rollouts)
    tree_row.tokens_unique = sum(s["token_end"] - s["token_start"] for s in specs)
    tree_row.tokens_per_call = sum(c.full_len for c in tree.calls)
    tree_row.payload_path = str(payload)
    tree_row.save(update_fields=["rollouts", "tokens_unique", "tokens_per_call", "payload_path"])
    return specs


# --------------------------------------------------------------------------- live runs


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


@transaction.atomic
def record_rollouts_written(
    *, run_id: int, path: str, decode: Decode | None = None
) -> dict[str, int]:
    """Import a live run's step file into its rows, idempotently: rollouts the events made
    get their ``payload_path`` (the first payload of a rollout wins), missing ones are
    created; a group's tree is built once, and rebuilt (from its stored payload plus the
    new rollouts) only when a later step brings rollouts of that group it lacks.
    An unreadable file is logged and skipped: it must not fail the run. -> counts."""
    source = Path(path)
    try:
        stored = keep_copy(run_id, source)
        rollouts = list(read_rollouts(stored))
    except (OSError, TrajectoryFormatError) as err:
        log.warning("run %s: payload %s not imported: %s", run_id, path, err)
        return {"rollouts": 0, "trees": 0, "nodes": 0}
    if decode is None:
        from gyre_web.trajectories.node_tokens import run_decoder, save_tokenizer

        save_tokenizer(run_id=run_id)
        decode = run_decoder(run_id=run_id)
    known = {
        r.rollout_id: r
        for r in Rollout.objects.select_for_update().filter(
            run_id=run_id, rollout_id__in=[r.rollout_id for r in rollouts]
        )
    }
    fresh = [rollout_row(run_id, r, stored) for r in rollouts if r.rollout_id not in known]
    Rollout.objects.bulk_create(fresh, ignore_conflicts=True)
    for r in rollouts:
        row = known.get(r.rollout_id)
        if row is not None and not row.payload_path:
            row.payload_path = str(stored)
            row.task_id = row.task_id or r.task_id
            row.group_id = row.group_id or r.group_id
            row.save(update_fields=["payload_path", "task_id", "group_id"])
    trees = nodes = 0
    by_group: dict[str, list[CoreRollout]] = {}
    for r in rollouts:
        by_group.setdefault(r.group_id, []).append(r)
    for group_id, members in by_group.items():
        tree_row, _ = Tree.objects.select_for_update().get_or_create(
            run_id=run_id, group_id=group_id
        )
        payload, group = stored, members
        if tree_row.payload_path:
            before = _group_rollouts(Path(tree_row.payload_path), group_id)
            seen = {r.rollout_id for r in before}
            new = [r for r in members if r.rollout_id not in seen]
            if not new:
                continue  # a redelivery, or a rerun of rollouts the tree already holds
            group = before + new
            payload = _write_group(run_id, group_id, group)
        tree = build_trees(group)[group_id]
        try:
            with transaction.atomic():  # a tree the rows cannot hold must not fail the run
                specs = store_tree(tree_row=tree_row, tree=tree, payload=payload, decode=decode)
        except ValueError as err:
            log.warning("run %s: tree %s not stored: %s", run_id, group_id, err)
            continue
        nodes += len(specs)
        trees += 1
    return {"rollouts": len(fresh), "trees": trees, "nodes": nodes}


def _group_rollouts(path: Path, group_id: str) -> list[CoreRollout]:
    try:
        return [r for r in read_rollouts(path) if r.group_id == group_id]
    except (OSError, TrajectoryFormatError) as err:
        log.warning("payload %s unreadable, tree %s rebuilt without it: %s", path, group_id, err)
        return []


def _write_group(run_id: int, group_id: str, rollouts: list[CoreRollout]) -> Path:
    """One group's rollouts gathered from several step files, as one payload file."""
    ids = hashlib.sha256("\n".join(r.rollout_id for r in rollouts).encode()).hexdigest()[:16]
    folder = payload_folder(run_id) / "trees"
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{_safe(group_id)}-{ids}.jsonl"
    tmp = dest.with_suffix(".tmp")
    write_rollouts(tmp, rollouts)
    tmp.replace(dest)
    return dest
