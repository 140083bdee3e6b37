"""Pack prefix trees into training samples of at most ``max_tokens`` tokens.

Lay a group's tree out in depth-first preorder. A *piece* is a contiguous range of that
order: every ancestor of a token in the range is either in the range or on the path to
the range's first token, so a piece needs exactly one ancestor path as non-trainable
context — the first token's depth in tokens. A tree that fits is one piece. A tree that
does not is cut into consecutive ranges, each as long as its context allows; where a cut
may fall anywhere near the end of a range, it falls before the shallowest node start so
that the next piece repeats the least context (cost ``depth - position``: a token of room
left unused counts as much as a token of context repeated). Pieces are then bin-packed
into samples (first-fit decreasing). Ranges are disjoint, so every generated token is
trainable in exactly one sample.

A path longer than ``max_tokens`` is *cut*: the positions at depth ``>= max_tokens`` are
left out of the layout (none of them can be trained: its context alone fills a sample),
and counted (:func:`tokens_cut`). A tree with no position (a group whose rollouts made
no call) packs into nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.tree import Node, PrefixTree

# How much a token of room left unused in a piece weighs against a token of context
# repeated by the next piece. Rooms are filled later by bin-packing other pieces, so it
# weighs less than 1; the best weight depends on the tree's shape, and splitting is cheap,
# so each tree is split with each weight and the split repeating the least context wins.
ROOM_COSTS = (0.5, 0.25, 1.0)


@dataclass(slots=True)
class Layout:
    """A tree in preorder: ``offset[i]`` is where ``nodes[i]`` starts in the order and
    ``lens[i]`` how many of its tokens are laid out (all but those at depth >= the
    layout's limit)."""

    tree: PrefixTree
    nodes: list[Node]
    offset: npt.NDArray[np.int64]
    total: int
    lens: npt.NDArray[np.int64]

    @classmethod
    def of(cls, tree: PrefixTree, limit: int | None = None) -> Layout:
        """The tree's positions at depth < ``limit`` (all when None) in preorder."""
        nodes = [n for n in tree.nodes() if limit is None or n.start < limit]
        cap = (lambda n: len(n)) if limit is None else (lambda n: min(len(n), limit - n.start))
        lens = np.fromiter((cap(n) for n in nodes), dtype=np.int64, count=len(nodes))
        offset = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        return cls(tree, nodes, offset[:-1], int(offset[-1]), lens)

    def depth(self, pos: int) -> int:
        """Depth of the token at preorder position ``pos`` (0 past the end)."""
        if pos >= self.total:
            return 0
        i = int(np.searchsorted(self.offset, pos, side="right")) - 1
        return self.nodes[i].start + pos - int(self.offset[i])


@dataclass(slots=True)
class Piece:
    layout: Layout
    begin: int  # preorder range [begin, end) trained here
    end: int
    context: int  # depth of the first token: the ancestor path carried along

    @property
    def size(self) -> int:
        return self.context + self.end - self.begin


def tokens_cut(tree: PrefixTree, max_tokens: int) -> int:
    """The tree's positions at depth >= ``max_tokens``: what packing leaves out."""
    return sum(n.end - max(n.start, max_tokens) for n in tree.nodes() if n.end > max_tokens)


def split_tree(tree: PrefixTree, max_tokens: int) -> list[Piece]:
    """The tree's pieces of at most ``max_tokens`` (none for an empty tree); positions at
    depth >= ``max_tokens`` are cut (see the module docstring)."""
    lay = Layout.of(tree, max_tokens)
    if lay.total == 0:
        return []
    if lay.total <= max_tokens:
        return [Piece(lay, 0, lay.total, 0)]
    splits = [_split(lay, max_tokens, w) for w in ROOM_COSTS]
    return min(splits, key=lambda ps: (sum(p.context for p in ps), len(ps)))


def _split(lay: Layout, max_tokens: int, room_cost: float) -> list[Piece]:
    pieces: list[Piece] = []
    s = 0
    while s < lay.total:
        ctx = lay.depth(s)
        e_max = min(lay.total, s + max_tokens - ctx)
        e = e_max
        if e_max < lay.total:  # choose the cut: node starts in (s, e_max] are candidates
            lo = int(np.searchsorted(lay.offset, s, side="right"))
            hi = int(np.searchsorted(lay.offset, e_max, side="right"))
            best = float(lay.depth(e_max))
            for i in range(lo, hi):
                cost = lay.nodes[i].start + room_cost * (e_max - int(lay.offset[i]))
                if cost <= best:
                    best, e = cost, int(lay.offset[i])
        pieces.append(Piece(lay, s, e, ctx))
        s = e
    return pieces


def pack_pieces(pieces: Iterable[Piece], max_tokens: int) -> list[list[Piece]]:
    """First-fit decreasing over piece sizes (stable: equal sizes keep their order)."""
    bins: list[list[Piece]] = []
    room: list[int] = []
    for p in sorted(pieces, key=lambda p: -p.size):
        for i, free in enumerate(room):
            if p.size <= free:
                bins[i].append(p)
                room[i] -= p.size
                break
        else:
            bins.append([p])
            room.append(max_tokens - p.size)
    return bins


def materialise(pieces: list[Piece]) -> PackedSample:
    """Lay pieces out one after another: each one's context path, then its range."""
    group_ids: list[str] = []
    cols: dict[str, list[npt.NDArray[np.generic]]] = {
        k: [] for k in ("ids", "pos", "par", "tr", "w", "lp", "v", "g", "s", "r")
    }
    n = 0

    def emit(node: Node, a: int, b: int, parent_idx: int, trainable: bool, g: int) -> int:
        """Append node positions [a, b); return the index of the last one."""
        nonlocal n
        length = b - a
        par = np.arange(n - 1, n + length - 1, dtype=np.int64)
        par[0] = parent_idx
        tr = node.generated[a:b] & node.taken[a:b] if trainable else np.zeros(length, dtype=bool)
        cols["ids"].append(node.tokens[a:b].astype(np.int64))
        cols["pos"].append(np.arange(node.start + a, node.start + b, dtype=np.int64))
        cols["par"].append(par)
        cols["tr"].append(tr)
        cols["w"].append(np.where(tr, node.weight[a:b], 0.0))
        cols["lp"].append(np.where(tr, node.logprob[a:b], np.nan))
        cols["v"].append(np.where(tr, node.version[a:b], -1))
        cols["g"].append(np.full(length, g, dtype=np.int32))
        cols["s"].append(np.where(tr, node.scale[a:b], 1.0))
        cols["r"].append(np.where(tr, node.owner[a:b], -1))
        n += length
        return n - 1

    for piece in pieces:
        lay = piece.layout
        if lay.tree.group_id not in group_ids:
            group_ids.append(lay.tree.group_id)
        g = group_ids.index(lay.tree.group_id)
        i = int(np.searchsorted(lay.offset, piece.begin, side="right")) - 1
        first, k = lay.nodes[i], piece.begin - int(lay.offset[i])
        last_of: dict[Node, int] = {}  # node -> sample index of its last emitted token
        prev = -1
        for node in lay.tree.path(first)[:-1]:  # the context: ancestors, whole
            prev = last_of[node] = emit(node, 0, len(node), prev, False, g)
        if k:  # ... and the first node's tokens before the range
            prev = emit(first, 0, k, prev, False, g)
        pos = piece.begin
        while pos < piece.end:
            node = lay.nodes[i]
            a = pos - int(lay.offset[i])
            b = min(int(lay.lens[i]), piece.end - int(lay.offset[i]))
            if a > 0:
                parent_idx = prev  # the node's earlier tokens: context just emitted
            elif node.parent is None or node.parent is lay.tree.root:
                parent_idx = -1
            else:
                parent_idx = last_of[node.parent]
            prev = last_of[node] = emit(node, a, b, parent_idx, True, g)
            pos += b - a
            i += 1
    return PackedSample(
        group_ids=group_ids,
        group=np.concatenate(cols["g"]).astype(np.int32),
        input_ids=np.concatenate(cols["ids"]).astype(np.int64),
        position_ids=np.concatenate(cols["pos"]).astype(np.int64),
        parent=np.concatenate(cols["par"]).astype(np.int64),
        trainable=np.concatenate(cols["tr"]).astype(bool),
        advantage=np.concatenate(cols["w"]).astype(np.float64),
        logprob=np.concatenate(cols["lp"]).astype(np.float64),
        version=np.concatenate(cols["v"]).astype(np.int64),
        scale=np.concatenate(cols["s"]).astype(np.float64),
        rollout=np.concatenate(cols["r"]).astype(np.int64),
    )


def pack_trees(trees: Iterable[PrefixTree], max_tokens: int) -> list[PackedSample]:
    """Samples of at most ``max_tokens`` tokens; weights must already be assigned."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    pieces = [p for t in trees for p in split_tree(t, max_tokens)]
    return [materialise(b) for b in pack_pieces(pieces, max_tokens)]
