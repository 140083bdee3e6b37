"""Reads for rollouts and trees: children of a node (lazy loading), search, path to a node."""

from __future__ import annotations

from django.db.models import QuerySet

from gyre_core.trajectory.export import KEY_WIDTH
from gyre_web.trajectories.models import TreeNode


def children(*, tree_id: int, parent_id: int | None) -> QuerySet[TreeNode]:
    return TreeNode.objects.filter(tree_id=tree_id, parent_id=parent_id).order_by("path_key")


def search_nodes(*, tree_id: int, text: str, limit: int = 100) -> QuerySet[TreeNode]:
    return TreeNode.objects.filter(tree_id=tree_id, preview__icontains=text).order_by("path_key")[
        :limit
    ]


def path_to(*, node: TreeNode) -> list[TreeNode]:
    """The node's ancestors from the root down to the node itself, in one query."""
    width = KEY_WIDTH
    keys = [node.path_key[: width * (i + 1)] for i in range(len(node.path_key) // width)]
    return list(TreeNode.objects.filter(tree_id=node.tree_id, path_key__in=keys).order_by("depth"))
