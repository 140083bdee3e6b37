"""What the tree browser shows of a trajectory tree, made in one place for every caller.

A run's tree is weighed as its trainer weighs it (``gyre_core.config.run_weighting`` reads
the run's ``train.advantage_mode``, ``train.normalise_std`` and ``train.average``;
``Weighting`` is what the trainer's config hands its ``weigh``). ``export_group`` builds a group's tree once and turns it into
node specs; given one training step's batch, it is the tree that step's trainer weighed
(the trainer weighs each step's batch on its own, so a group split across two steps has a
tree per part); ``node_tokens`` finds a node of that same tree by its path key and lists its
tokens. The platform stores the specs and serves the tokens; it does not walk trees.

A path key is the node's child ordinals from the root, each as ``KEY_WIDTH`` base-36
digits: sorting by it walks the tree depth-first, a node's subtree is the keys that start
with its key, and the ordinals are positions in ``Node.children``'s own order.

The payload file's reader and writer (``read_rollouts``, ``write_rollouts``,
``format_fields``) and the types they carry are named here too, so that this module is the
platform's one door into trees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gyre_core.events import storable_text
from gyre_core.trajectory.format import Rollout, TrajectoryFormatError, read_rollouts
from gyre_core.trajectory.paths import PathSampling, draw
from gyre_core.trajectory.rewards import Weighting
from gyre_core.trajectory.tree import Node, PrefixTree
from gyre_core.trajectory.writer import rollout_to_json, write_rollouts

PREVIEW_TOKENS = 24  # tokens shown in a node's preview
KEY_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
KEY_WIDTH = 3  # base-36 digits per level: up to 46,656 children under one node
MAX_DEPTH = 800  # levels that fit the platform's path_key column (KEY_WIDTH characters each)
Decode = Callable[[list[int]], str]

__all__ = [
    "KEY_WIDTH",
    "MAX_DEPTH",
    "PREVIEW_TOKENS",
    "Decode",
    "GroupExport",
    "PathMarks",
    "PrefixTree",
    "Rollout",
    "TrajectoryFormatError",
    "Weighting",
    "export_group",
    "format_fields",
    "node_advantage",
    "node_at",
    "node_tokens",
    "path_key",
    "read_rollouts",
    "write_rollouts",
]


def path_key(ordinals: list[int]) -> str:
    """Fixed-width base-36 child ordinals, concatenated (see the module docstring)."""
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


def ids_preview(tokens: Any) -> str:
    ids = [int(t) for t in np.asarray(tokens[:PREVIEW_TOKENS]).tolist()]
    more = " …" if len(tokens) > PREVIEW_TOKENS else ""
    return "[" + " ".join(map(str, ids)) + more + "]"


def node_advantage(node: Node) -> float | None:
    """The mean loss weight over the node's generated tokens; None when it has none."""
    if not node.generated.any():
        return None
    return round(float(np.mean(node.weight[node.generated])), 6)


@dataclass(frozen=True, slots=True)
class PathMarks:
    """The paths a training step took of a run's tree (``train.max_paths``,
    ``train.path_roles``): drawn again with the run's ``seed`` at the ``version`` the step
    trained (``gyre_core.config.run_path_sampling``), so the browser marks per node how
    many generated tokens the step trained. The browser's tree is not pruned."""

    sampling: PathSampling
    seed: int
    version: int

    def apply(self, tree: PrefixTree) -> None:
        if not self.sampling.everything:
            draw(tree, self.sampling, self.seed, self.version)


@dataclass(frozen=True, slots=True)
class GroupExport:
    """One group's weighed tree and what the browser stores of it."""

    tree: PrefixTree
    nodes: list[dict[str, Any]]  # preorder; see ``node_specs``
    rollouts: int
    tokens_unique: int
    tokens_per_call: int  # what per-call storage would hold


def export_group(
    rollouts: Iterable[Rollout],
    group_id: str,
    weighting: Weighting,
    decode: Decode | None,
    marks: PathMarks | None = None,
) -> GroupExport | None:
    """The group's tree, built once and weighed with ``weighting`` (and its taken paths
    marked with ``marks``, a training step's), and its node specs; None when no rollout
    belongs to the group."""
    tree = weighting.trees(r for r in rollouts if r.group_id == group_id).get(group_id)
    if tree is None:
        return None
    if marks is not None:
        marks.apply(tree)
    specs = node_specs(tree, decode)
    return GroupExport(
        tree=tree,
        nodes=specs,
        rollouts=len(tree.rollouts),
        tokens_unique=sum(s["token_end"] - s["token_start"] for s in specs),
        tokens_per_call=sum(c.full_len for c in tree.calls),
    )


def node_specs(tree: PrefixTree, decode: Decode | None) -> list[dict[str, Any]]:
    """Preorder (parent before child, children in the tree's own order) node dicts of a
    weighed tree: ``id``, ``parent`` (None under the root), ``kind``, ``depth``,
    ``path_key``, the token span, ``trainable``, ``preview`` (decoded when ``decode`` is
    given, token ids otherwise; storable text either way), ``advantage``, ``leaves`` and
    ``taken`` (the generated tokens a path-sampled step trained; None: every one)."""
    specs: list[dict[str, Any]] = []
    ids: dict[int, int] = {}
    sampled = tree.taken_paths is not None
    keys: dict[int, str] = {id(tree.root): ""}  # a child's key is its parent's plus one level
    stack = [(c, n) for n, c in reversed(list(enumerate(tree.root.children.values())))]
    while stack:
        node, nth = stack.pop()
        parent = node.parent if node.parent is not None else tree.root
        key = keys[id(parent)] + path_key([nth])
        keys[id(node)] = key
        ids[id(node)] = len(specs)
        opener = tree.calls[node.opener] if node.opener >= 0 else None
        head = [int(t) for t in node.tokens[:PREVIEW_TOKENS].tolist()]
        specs.append(
            {
                "id": len(specs),
                "parent": None if parent is tree.root else ids[id(parent)],
                "kind": opener.kind if opener else "continue",
                "depth": len(key) // KEY_WIDTH - 1,
                "path_key": key,
                "token_start": node.start,
                "token_end": node.end,
                "trainable": int(node.generated.sum()),
                # a token may decode to NUL, which PostgreSQL text refuses: shown as ␀
                "preview": storable_text(decode(head)) if decode else ids_preview(node.tokens),
                "advantage": node_advantage(node),
                "leaves": 0 if node.children else 1,
                "taken": int((node.generated & node.taken).sum()) if sampled else None,
            }
        )
        kids = list(enumerate(node.children.values()))
        stack.extend((c, n) for n, c in reversed(kids))
    for spec in reversed(specs):  # children come after their parent: sum leaves upwards
        if spec["parent"] is not None:
            specs[spec["parent"]]["leaves"] += spec["leaves"]
    return specs


def node_at(tree: PrefixTree, key: str) -> Node | None:
    """The node whose path key is ``key``; None when the tree has no such node."""
    node = tree.root
    for i in range(0, len(key), KEY_WIDTH):
        kids = list(node.children.values())
        try:
            nth = int(key[i : i + KEY_WIDTH], 36)
        except ValueError:
            return None
        if nth >= len(kids):
            return None
        node = kids[nth]
    return node if node is not tree.root else None


def node_tokens(
    tree: PrefixTree, key: str, span: tuple[int, int], limit: int
) -> dict[str, Any] | None:
    """The tokens of the node at ``key`` as parallel lists, at most ``limit`` of them
    (``truncated`` says when cut): ids, ``generated``, and where generated its
    log-probability, policy version, advantage (loss weight) and scale (``train.average``'s
    factor: the token's loss counts ``advantage`` times ``scale``, as the trainer counts
    it, with every token fresh), else None; plus the node's ``advantage``. None when the tree has no node there with that token span (the
    rows were made from another tree)."""
    node = node_at(tree, key)
    if node is None or (node.start, node.end) != span:
        return None
    n = min(len(node), limit)
    gen = [bool(g) for g in node.generated[:n]]

    def where(values: Iterable[Any]) -> list[Any]:
        return [v if g else None for v, g in zip(values, gen, strict=True)]

    return {
        "truncated": n < len(node),
        "ids": [int(t) for t in node.tokens[:n]],
        "generated": gen,
        "logprobs": where(round(float(x), 6) for x in node.logprob[:n]),
        "versions": where(int(v) for v in node.version[:n]),
        "advantages": where(round(float(w), 6) for w in node.weight[:n]),
        "scales": where(round(float(x), 9) for x in node.scale[:n]),
        "advantage": node_advantage(node),
    }


def format_fields(rollout: Rollout) -> dict[str, Any]:
    """One rollout as a ``gyre.trajectory/v1`` line holding the format's fields only (its
    ``extra``, a file's unknown keys, dropped), tokens and numbers exactly as parsed
    (``write_rollouts`` keeps ``extra`` and rounds log-probabilities)."""
    return rollout_to_json(rollout, exact=True, extra=False)
