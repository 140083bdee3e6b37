"""Writes for rollouts and trees, derived from the run's events and its payload files
(idempotent: a replayed event updates the same row, never a duplicate). A tree's node rows
are ``gyre_core.trajectory.export``'s specs, weighed as the run's trainer weighs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.db import transaction

from gyre_core.config import run_path_sampling, run_weighting
from gyre_core.trajectory.export import (
    MAX_DEPTH,
    Decode,
    GroupExport,
    PathMarks,
    TrajectoryFormatError,
    export_group,
    path_key,
    read_rollouts,
)
from gyre_core.trajectory.export import Rollout as CoreRollout
from gyre_web.runs.models import Run
from gyre_web.trajectories import payloads
from gyre_web.trajectories.models import Rollout, Tree, TreeNode

log = logging.getLogger(__name__)


def _rollout_fields(e: dict[str, Any]) -> dict[str, Any]:
    """The Rollout columns that one event sets."""
    data, kind = e["data"], e["kind"]
    if kind == "rollout_started":
        return {
            "task_id": str(data.get("task_id", "")),
            "group_id": str(data.get("group_id", "")),
            "step": int(data.get("step", 0)),
            "t_started": float(e["t"]),
        }
    if kind == "rollout_progress":
        return {
            "turns": int(data.get("turns", 0)),
            "tokens": int(data.get("tokens", 0)),
            "progress": float(data.get("progress", 0.0)),
        }
    versions = list(data.get("versions") or [None, None])
    return {
        "status": str(data.get("status", "done")),
        "progress": float(data.get("progress", 0.0)),
        "reward": float(data["reward"]) if data.get("reward") is not None else None,
        "turns": int(data.get("turns", 0)),
        "tokens": int(data.get("tokens", 0)),
        "version_min": versions[0],
        "version_max": versions[-1],
        "t_finished": float(e["t"]),
    }


@transaction.atomic
def record_rollout_events(*, run_id: int, events: list[dict[str, Any]]) -> None:
    """Fold a batch of rollout events into one row per rollout (a few queries per batch,
    not per event); a replayed event rewrites the same row, never a duplicate."""
    changes: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["kind"] in ("rollout_started", "rollout_progress", "rollout_finished"):
            rid = str(e["data"]["rollout_id"])
            changes.setdefault(rid, {}).update(_rollout_fields(e))
    if changes:
        _upsert_rollouts(run_id, changes)
    written = [e for e in events if e["kind"] == "rollouts_written"]
    if written:  # after the rows above exist, so the payload merges into them
        for e in written:
            path, step = str(e["data"]["path"]), int(e["data"]["step"])
            record_rollouts_written(run_id=run_id, path=path, step=step)


def _upsert_rollouts(run_id: int, changes: dict[str, dict[str, Any]]) -> None:
    existing = {
        r.rollout_id: r
        for r in Rollout.objects.select_for_update().filter(
            run_id=run_id, rollout_id__in=list(changes)
        )
    }
    rows, touched = [], set()
    for rid, fields in changes.items():
        row = existing.get(rid) or Rollout(run_id=run_id, rollout_id=rid)
        for name, value in fields.items():
            setattr(row, name, value)
        touched.update(fields)
        rows.append(row)
    # One upsert: existing rows carry their current values plus the batch's changes.
    Rollout.objects.bulk_create(
        rows,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["run", "rollout_id"],
        update_fields=sorted(touched),
    )


@transaction.atomic
def create_tree(
    *, run_id: int, group_id: str, nodes: list[dict[str, Any]], payload_path: str = ""
) -> Tree:
    """Store a tree's node metadata. ``nodes`` are dicts in parent-before-child order, each
    with ``id`` and ``parent`` (None for the root) plus the TreeNode fields."""
    tree = Tree.objects.create(
        run_id=run_id, group_id=group_id, nodes=len(nodes), payload_path=payload_path
    )
    store_nodes(tree=tree, nodes=nodes)
    return tree


@transaction.atomic
def store_nodes(*, tree: Tree, nodes: list[dict[str, Any]]) -> None:
    """Replace the tree's nodes by ``nodes`` (as for ``create_tree``); sets ``nodes``,
    ``depth`` and ``branch_counts`` on the tree row."""
    TreeNode.objects.filter(tree=tree).delete()
    ordinals: dict[Any, list[int]] = {}
    children_seen: dict[Any, int] = {}
    branch_counts: dict[str, int] = {}
    levels: list[list[tuple[Any, Any, TreeNode]]] = []  # (id, parent id, row) per depth
    for spec in nodes:
        parent_id = spec.get("parent")
        if parent_id is not None and parent_id not in ordinals:
            raise ValueError(f"node {spec['id']!r} names parent {parent_id!r} before it exists")
        if spec["id"] in ordinals:
            raise ValueError(f"node id {spec['id']!r} appears twice")
        nth = children_seen.get(parent_id, 0)
        children_seen[parent_id] = nth + 1
        ordinal = [*ordinals.get(parent_id, []), nth] if parent_id is not None else [nth]
        if len(ordinal) > MAX_DEPTH:
            raise ValueError(f"node {spec['id']!r} is deeper than {MAX_DEPTH} levels")
        ordinals[spec["id"]] = ordinal
        kind = str(spec.get("kind", "continue"))
        branch_counts[kind] = branch_counts.get(kind, 0) + 1
        row = TreeNode(
            tree=tree,
            kind=kind,
            depth=len(ordinal) - 1,
            path_key=path_key(ordinal),
            token_start=int(spec.get("token_start", 0)),
            token_end=int(spec.get("token_end", 0)),
            trainable=int(spec.get("trainable", 0)),
            preview=str(spec.get("preview", ""))[:300],
            advantage=spec.get("advantage"),
            leaves=int(spec.get("leaves", 0)),
            taken=spec.get("taken"),
        )
        while len(levels) < len(ordinal):
            levels.append([])
        levels[len(ordinal) - 1].append((spec["id"], parent_id, row))
    # One bulk insert per depth: a level's parents have their primary keys by then.
    pks: dict[Any, int] = {}
    for level in levels:
        for _, parent_id, row in level:
            row.parent_id = pks[parent_id] if parent_id is not None else None
        TreeNode.objects.bulk_create([row for _, _, row in level], batch_size=2000)
        pks.update({node_id: row.pk for node_id, _, row in level})
    tree.nodes = len(nodes)
    tree.depth = max((len(o) - 1 for o in ordinals.values()), default=0)
    tree.branch_counts = branch_counts
    tree.save(update_fields=["nodes", "depth", "branch_counts"])


# --------------------------------------------------------------------------- payloads


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


def store_tree(*, tree_row: Tree, export: GroupExport, payload: Path) -> int:
    """(Re)write a Tree row's nodes and counts from its group's export; -> nodes stored."""
    store_nodes(tree=tree_row, nodes=export.nodes)
    tree_row.rollouts = export.rollouts
    tree_row.tokens_unique = export.tokens_unique
    tree_row.tokens_per_call = export.tokens_per_call
    tree_row.payload_path = str(payload)
    tree_row.save(update_fields=["rollouts", "tokens_unique", "tokens_per_call", "payload_path"])
    return len(export.nodes)


@transaction.atomic
def record_rollouts_written(
    *, run_id: int, path: str, step: int, decode: Decode | None = None
) -> dict[str, int]:
    """Import a live run's step file (the batch the trainer trained at ``step``) into its
    rows, idempotently: rollouts the events made get their ``payload_path`` (the first
    payload of a rollout wins), missing ones are created; each group of the file gets the
    tree of this step part, weighed on its own as the trainer weighed it (a group whose
    rollouts span two steps has a tree per step). A redelivered file changes nothing; a
    step trained again (after a resume) replaces that step's trees. An unreadable file is
    logged and skipped: it must not fail the run. -> counts."""
    source = Path(path)
    try:
        stored = payloads.keep_copy(run_id, source)
        rollouts = list(read_rollouts(stored))
    except (OSError, TrajectoryFormatError) as err:
        log.warning("run %s: payload %s not imported: %s", run_id, path, err)
        return {"rollouts": 0, "trees": 0, "nodes": 0}
    if decode is None:
        payloads.save_tokenizer(run_id=run_id)
        decode = payloads.run_decoder(run_id=run_id)
    config = Run.objects.filter(pk=run_id).values_list("config", flat=True).first()
    weighting = run_weighting(config or {})
    sampling, seed = run_path_sampling(config or {})
    marks = PathMarks(sampling, seed, step - 1)  # the step trained the version before it
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
    for group_id in dict.fromkeys(r.group_id for r in rollouts):
        tree_row, _ = Tree.objects.select_for_update().get_or_create(
            run_id=run_id, group_id=group_id, step=step
        )
        if tree_row.payload_path == str(stored):
            continue  # a redelivery: this step part's tree is stored
        export = export_group(rollouts, group_id, weighting, decode, marks)
        if export is None:
            continue
        try:
            with transaction.atomic():  # a tree the rows cannot hold must not fail the run
                nodes += store_tree(tree_row=tree_row, export=export, payload=stored)
        except ValueError as err:
            log.warning("run %s: tree %s of step %s not stored: %s", run_id, group_id, step, err)
            continue
        payloads.remember_tree(stored, group_id, weighting, export.tree)
        trees += 1
    return {"rollouts": len(fresh), "trees": trees, "nodes": nodes}
