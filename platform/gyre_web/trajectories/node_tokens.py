"""Per-token detail of one tree node, read from the tree's payload file: token ids, their
text (with the run's tokenizer, when it has one), and per token whether it was generated,
its log-probability, the policy version that produced it and its advantage (loss weight,
weighed as the run's trainer weighs: ``gyre_core.config.run_weighting``).

The node is found in the payload's tree (``payloads.payload_tree``) by its path key
(``gyre_core.trajectory.export.node_tokens``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre_core.config import run_weighting
from gyre_core.trajectory.export import TrajectoryFormatError, node_tokens
from gyre_web.runs.models import Run
from gyre_web.trajectories.models import Tree, TreeNode
from gyre_web.trajectories.payloads import load_tokenizer, payload_tree, tokenizer_path

MAX_TOKENS = 20_000  # tokens one answer carries; a longer node is cut (``truncated``)


def read_node_tokens(*, tree: Tree, node: TreeNode) -> dict[str, Any]:
    """The node's tokens as parallel lists (``payload`` false, lists empty, when the tree
    has no readable payload or the payload does not hold this node)."""
    out: dict[str, Any] = {
        "node": node.pk,
        "token_start": node.token_start,
        "token_end": node.token_end,
        "advantage": node.advantage,
        "payload": False,
        "decoded": False,
        "truncated": False,
        "text": None,
        "ids": [],
        "pieces": None,
        "generated": [],
        "logprobs": [],
        "versions": [],
        "advantages": [],
        "scales": [],
    }
    got = _tokens_of(tree, node)
    if got is None:
        return out
    if node.advantage is not None:
        got["advantage"] = node.advantage  # the stored figure stands
    out.update(got, payload=True)
    tok = load_tokenizer(tokenizer_path(run_id=tree.run_id))
    if tok is not None:
        ids = out["ids"]
        pieces = tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        text = tok.decode(ids, skip_special_tokens=False)
        out.update(decoded=True, text=str(text), pieces=[str(p) for p in pieces])
    return out


def _tokens_of(tree: Tree, node: TreeNode) -> dict[str, Any] | None:
    if not tree.payload_path:
        return None
    config = Run.objects.filter(pk=tree.run_id).values_list("config", flat=True).first()
    try:
        core = payload_tree(Path(tree.payload_path), tree.group_id, run_weighting(config or {}))
    except (OSError, TrajectoryFormatError, ValueError):  # ValueError: a mode it lacks
        return None
    if core is None:
        return None
    span = (node.token_start, node.token_end)
    return node_tokens(core, node.path_key, span, MAX_TOKENS)
