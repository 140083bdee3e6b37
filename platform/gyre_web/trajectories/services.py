"""Writes for rollouts and trees, derived from the run's events (idempotent: a replayed
event updates the same row, never a duplicate)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from gyre_web.trajectories.models import Rollout, Tree, TreeNode


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
        elif e["kind"] == "tree_ready":
            _record_tree_ready(run_id, e["data"])
    if changes:
        _upsert_rollouts(run_id, changes)
    written = [e for e in events if e["kind"] == "rollouts_written"]
    if written:  # after the rows above exist, so the payload merges into them
        from gyre_web.trajectories.payloads import record_rollouts_written

        for e in written:
            record_rollouts_written(run_id=run_id, path=str(e["data"]["path"]))


def _record_tree_ready(run_id: int, data: dict[str, Any]) -> None:
    """A tree's counts from the runtime; once its payload is imported, the counts of the
    stored nodes stand (a group whose rollouts span two steps has a ``tree_ready`` each)."""
    tree, _ = Tree.objects.select_for_update().get_or_create(
        run_id=run_id, group_id=str(data["group_id"])
    )
    if tree.payload_path:
        return
    tree.rollouts = int(data.get("rollouts", 0))
    tree.tokens_unique = int(data.get("tokens_unique", 0))
    tree.tokens_per_call = int(data.get("tokens_per_call", 0))
    tree.nodes = int(data.get("nodes", 0))
    tree.save(update_fields=["rollouts", "tokens_unique", "tokens_per_call", "nodes"])


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


KEY_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
KEY_WIDTH = 3  # base-36 digits per level: up to 46,656 children under one node
MAX_DEPTH = 800  # levels that fit the path_key column (KEY_WIDTH characters each)


def path_key(ordinals: list[int]) -> str:
    """Fixed-width base-36 child ordinals, concatenated: sorting by the key walks the tree
    depth-first, and a node's subtree is the keys that start with its key."""
    out = []
    for n in ordinals:
        if not 0 <= n < 36**KEY_WIDTH:
            raise ValueError(f"a node has more than {36**KEY_WIDTH} children")
        digits = ""
        for _ in range(KEY_WIDTH):
            n, r = divmod(n, 36)
            digits = KEY_DIGITS[r] + digits
        out.append(digits)
    return "".join(out)


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
