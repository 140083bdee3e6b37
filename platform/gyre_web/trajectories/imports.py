"""Import of ``gyre.trajectory/v1`` JSONL files (from Gyre or another harness) into a run's
rollouts and trees. The file itself is kept as the token payload; rows hold metadata only.
Text previews show token ids unless a tokenizer is given (``decode``)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import transaction

from gyre_core.trajectory.format import Rollout as CoreRollout
from gyre_core.trajectory.format import TrajectoryFormatError, read_rollouts
from gyre_core.trajectory.tree import Node, PrefixTree, build_trees
from gyre_web.trajectories.models import Rollout, Tree
from gyre_web.trajectories.services import create_tree

PREVIEW_TOKENS = 24  # tokens shown in a node's preview


class ImportRejected(ValueError):
    """The file cannot be imported; ``line`` and ``field`` locate the problem (0/"" if none)."""

    def __init__(self, problem: str, line: int = 0, field: str = "") -> None:
        super().__init__(f"line {line}: {field}: {problem}" if line else problem)
        self.problem, self.line, self.field = problem, line, field


def _ids_preview(tokens: Any) -> str:
    ids = [int(t) for t in tokens[:PREVIEW_TOKENS]]
    more = " …" if len(tokens) > PREVIEW_TOKENS else ""
    return "[" + " ".join(map(str, ids)) + more + "]"


def _node_specs(tree: PrefixTree, decode: Callable[[list[int]], str] | None) -> list[dict]:
    """Preorder (parent before child) node dicts for ``create_tree``; leaves counted below."""
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
        tokens = node.tokens
        specs.append(
            {
                "id": len(specs),
                "parent": None if parent is None or parent is tree.root else ids[id(parent)],
                "kind": opener.kind if opener else "continue",
                "token_start": node.start,
                "token_end": node.end,
                "trainable": int(node.generated.sum()),
                "preview": decode([int(t) for t in tokens[:PREVIEW_TOKENS]])
                if decode
                else _ids_preview(tokens),
                "leaves": leaves(node),
            }
        )
        stack.extend(reversed(list(node.children.values())))
    return specs


def import_trajectories(
    *, run: Any, upload: IO[bytes], decode: Callable[[list[int]], str] | None = None
) -> dict[str, int]:
    """Validate and store a JSONL upload; -> counts. Raises ImportRejected (nothing stored)."""
    folder = Path(settings.GYRE_RUNS_DIR) / str(run.pk) / "imports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.jsonl"
    with open(path, "wb") as out:
        shutil.copyfileobj(upload, out)
    try:
        rollouts: list[CoreRollout] = list(read_rollouts(path))
    except TrajectoryFormatError as err:
        path.unlink()
        raise ImportRejected(err.problem, err.line, err.field) from None
    if not rollouts:
        path.unlink()
        raise ImportRejected("the file holds no rollout")
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
        path.unlink()
        dup = sorted(known) or sorted(known_groups)
        raise ImportRejected(f"already imported into this run: {dup[:5]}", field="rollout_id")
    trees = build_trees(rollouts)
    with transaction.atomic():
        Rollout.objects.bulk_create([_rollout_row(run, r, path) for r in rollouts])
        nodes = 0
        for group_id, tree in trees.items():
            specs = _node_specs(tree, decode)
            row = create_tree(run_id=run.pk, group_id=group_id, nodes=specs,
                              payload_path=str(path))  # fmt: skip
            row.rollouts = len(tree.rollouts)
            row.tokens_unique = sum(s["token_end"] - s["token_start"] for s in specs)
            row.tokens_per_call = sum(c.full_len for c in tree.calls)
            row.save(update_fields=["rollouts", "tokens_unique", "tokens_per_call"])
            nodes += len(specs)
    return {"rollouts": len(rollouts), "trees": len(trees), "nodes": nodes}


def _rollout_row(run: Any, r: CoreRollout, path: Path) -> Rollout:
    versions = [int(v) for c in r.calls for v in c.versions]
    return Rollout(
        run=run,
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
