"""Shared-prefix trees: every call of a GRPO group merged into one compressed trie.

A node is a maximal token segment: the tree branches after it, or some call's full
sequence (full prompt + completion) ends exactly there. The path from the virtual root
to the end of a call's end node is exactly that call's context plus what it generated.

Building is linear in the tokens the log actually holds: a call written with ``prefix``
starts from the position its earlier call reached, found by walking up from that call's
end node, so no full prompt is ever materialised. Node identity is stable for call ends:
a split inserts a new *upper* node and the split node keeps the lower part (and the calls
that end at its end), so an end-node reference never goes stale.

Per position the tree keeps whether it was *generated* (some call generated it at that
position) and, from the first such call in file order, its log-probability and policy
version. Which calls and rollouts pass through a position follows from the call ends in
the subtree below it (``calls_through``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gyre_core.trajectory.format import Call, Rollout

TOKEN_DTYPE = np.int32


class Node:
    """A token segment. ``start`` is the depth (position id) of its first token."""

    __slots__ = (
        "children",
        "ends",
        "generated",
        "logprob",
        "opener",
        "owner",
        "parent",
        "scale",
        "start",
        "taken",
        "tokens",
        "version",
        "weight",
    )

    def __init__(
        self, tokens: npt.NDArray[np.int32], start: int, parent: Node | None, opener: int
    ) -> None:
        n = len(tokens)
        self.tokens = tokens
        self.start = start
        self.parent = parent
        self.opener = opener  # index (in the tree's calls) of the call that created this segment
        self.children: dict[int, Node] = {}
        self.ends: list[int] = []  # calls whose full sequence ends at this node's end
        self.generated = np.zeros(n, dtype=bool)
        self.logprob = np.zeros(n, dtype=np.float64)
        self.version = np.full(n, -1, dtype=np.int64)
        self.weight = np.zeros(n, dtype=np.float64)  # loss weight, set by rewards.assign_weights
        # which generated positions a step trains: all of them unless path sampling
        # (train.max_paths) left some out; untaken positions stay in the tree as context
        self.taken = np.ones(n, dtype=bool)
        # the lowest index of the rollouts that generated a position (-1: none), set by
        # rewards.assign_weights; a GSPO sequence is one rollout's tokens in a sample
        self.owner = np.full(n, -1, dtype=np.int64)
        # the loss's per-token factor of train.average (1: token; execution_then_batch:
        # the sum over its rollouts r of 1 / r's trained tokens), set by trajectory.average
        self.scale = np.ones(n, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def end(self) -> int:
        """Depth one past this node's last token (= the length of the path to its end)."""
        return self.start + len(self.tokens)

    def split(self, k: int) -> Node:
        """Cut this node after its first ``k`` tokens; return the new upper node.

        ``self`` keeps the lower part, its children and its call ends."""
        assert 0 < k < len(self.tokens)
        upper = Node.__new__(Node)
        upper.tokens, self.tokens = self.tokens[:k], self.tokens[k:]
        upper.generated, self.generated = self.generated[:k], self.generated[k:]
        upper.logprob, self.logprob = self.logprob[:k], self.logprob[k:]
        upper.version, self.version = self.version[:k], self.version[k:]
        upper.weight, self.weight = self.weight[:k], self.weight[k:]
        upper.taken, self.taken = self.taken[:k], self.taken[k:]
        upper.owner, self.owner = self.owner[:k], self.owner[k:]
        upper.scale, self.scale = self.scale[:k], self.scale[k:]
        upper.start, upper.parent, upper.opener = self.start, self.parent, self.opener
        upper.ends = []
        upper.children = {int(self.tokens[0]): self}
        assert self.parent is not None  # the virtual root is never split
        self.parent.children[int(upper.tokens[0])] = upper
        self.parent = upper
        self.start += k
        return upper


@dataclass(slots=True)
class CallRef:
    """What the tree keeps of a call once its tokens are merged in."""

    rollout: int  # index into the tree's rollouts
    call_id: str
    agent: str
    kind: str
    prompt_len: int
    full_len: int
    node: Node  # the node at whose end the call's full sequence ends


@dataclass(slots=True)
class RolloutInfo:
    rollout_id: str
    task_id: str
    status: str
    progress: float
    reward: float
    calls: list[int] = field(default_factory=list)  # indices into the tree's calls


class PrefixTree:
    """The compressed prefix tree of one group."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.root = Node(np.zeros(0, dtype=TOKEN_DTYPE), 0, None, -1)  # virtual, holds no token
        self.calls: list[CallRef] = []
        self.rollouts: list[RolloutInfo] = []
        # per rollout, the branch ends path sampling took (gyre_core.trajectory.paths);
        # None: not sampled, every path is trained
        self.taken_paths: dict[int, list[Node]] | None = None

    # ------------------------------------------------------------------ building

    def add(self, rollout: Rollout) -> None:
        """Merge every call of ``rollout`` into the tree (calls in file order)."""
        r = self.start_rollout(rollout)
        by_id: dict[str, CallRef] = {}
        for call in rollout.calls:
            self.add_call(r, call, by_id)

    def start_rollout(self, rollout: Rollout) -> int:
        info = RolloutInfo(
            rollout.rollout_id, rollout.task_id, rollout.status, rollout.progress, rollout.score
        )
        self.rollouts.append(info)
        return len(self.rollouts) - 1

    def add_call(self, r: int, call: Call, by_id: dict[str, CallRef]) -> CallRef:
        """Merge one call of rollout ``r``; ``by_id`` maps that rollout's earlier calls."""
        if call.prefix is None:
            node, k = self.root, 0
        else:
            node, k = _locate(by_id[call.prefix.call_id].node, call.prefix.tokens)
        seq = np.concatenate([call.prompt_ids, call.completion_ids]).astype(TOKEN_DTYPE)
        idx = len(self.calls)
        end = self._insert(node, k, seq, len(call.prompt_ids), call.logprobs, call.versions, idx)
        ref = CallRef(r, call.call_id, call.agent, call.kind, call.prompt_len, call.full_len, end)
        end.ends.append(idx)
        self.calls.append(ref)
        self.rollouts[r].calls.append(idx)
        by_id[call.call_id] = ref
        return ref

    def match(self, seq: npt.NDArray[np.int64]) -> tuple[Node, int]:
        """The deepest cursor ``(node, k)`` reached by following ``seq`` from the root;
        the matched length is ``node.start + k`` (``(root, 0)`` when nothing matches)."""
        node, k, i = self.root, 0, 0
        while i < len(seq):
            if k == len(node):
                child = node.children.get(int(seq[i]))
                if child is None:
                    break
                node, k = child, 0
                continue
            span = min(len(node) - k, len(seq) - i)
            diff = np.flatnonzero(node.tokens[k : k + span] != seq[i : i + span])
            same = int(diff[0]) if len(diff) else span
            i, k = i + same, k + same
            if same < span:
                break
        return node, k

    def _insert(
        self,
        node: Node,
        k: int,
        seq: npt.NDArray[np.int32],
        gen_from: int,
        logprobs: npt.NDArray[np.float64],
        versions: npt.NDArray[np.int64],
        call: int,
    ) -> Node:
        """Walk/extend the trie from cursor (node, k) along ``seq``; ``seq[gen_from:]`` was
        generated. Returns the node at whose end the sequence ends (splitting if needed)."""
        i, m = 0, len(seq)
        while i < m:
            if k == len(node):
                child = node.children.get(int(seq[i]))
                if child is None:
                    new = Node(seq[i:].copy(), node.end, node, call)
                    _mark(new, 0, i, gen_from, logprobs, versions, m - i)
                    node.children[int(seq[i])] = new
                    return new
                node, k = child, 0
                continue
            span = min(len(node) - k, m - i)
            diff = np.flatnonzero(node.tokens[k : k + span] != seq[i : i + span])
            same = int(diff[0]) if len(diff) else span
            _mark(node, k, i, gen_from, logprobs, versions, same)
            i, k = i + same, k + same
            if i < m and k < len(node):  # diverges inside the node: branch off here
                node = node.split(k)
                k = len(node)
        if k < len(node):  # the sequence ends inside the node: make its end a boundary
            node = node.split(k)
        return node

    # ------------------------------------------------------------------ reading

    def nodes(self) -> Iterator[Node]:
        """Every real node in depth-first preorder (children in first-token order)."""
        stack = sorted(self.root.children.values(), key=_first, reverse=True)
        while stack:
            n = stack.pop()
            yield n
            if n.children:
                stack.extend(sorted(n.children.values(), key=_first, reverse=True))

    def leaves(self) -> Iterator[Node]:
        return (n for n in self.nodes() if not n.children)

    def calls_through(self, node: Node) -> list[int]:
        """The calls whose full sequence passes through every position of ``node``."""
        out: list[int] = []
        stack = [node]
        while stack:
            n = stack.pop()
            out.extend(n.ends)
            stack.extend(n.children.values())
        return sorted(out)

    def rollouts_through(self, node: Node) -> list[int]:
        return sorted({self.calls[c].rollout for c in self.calls_through(node)})

    def branch_kind(self, node: Node) -> str:
        """The kind of the call that opened the branch this node's tokens lie on."""
        return self.calls[node.opener].kind

    def path(self, node: Node) -> list[Node]:
        """The nodes from a root down to ``node``, inclusive."""
        out = []
        n: Node | None = node
        while n is not None and n is not self.root:
            out.append(n)
            n = n.parent
        return out[::-1]

    def sequence(self, call: int) -> npt.NDArray[np.int32]:
        """Materialise a call's full sequence (tests and debugging only)."""
        return np.concatenate([n.tokens for n in self.path(self.calls[call].node)])

    @property
    def tokens_unique(self) -> int:
        return sum(len(n) for n in self.nodes())

    @property
    def trainable_tokens(self) -> int:
        return sum(int(n.generated.sum()) for n in self.nodes())


def _first(n: Node) -> int:
    return int(n.tokens[0])


def _locate(end_node: Node, depth: int) -> tuple[Node, int]:
    """The cursor after the first ``depth`` tokens on the path to ``end_node``'s end:
    ``(node, k)`` with ``node.start < depth <= node.end``, or ``(root, 0)`` for depth 0."""
    n = end_node
    if depth == 0:
        while n.parent is not None:
            n = n.parent
        return n, 0
    while n.start >= depth:
        assert n.parent is not None
        n = n.parent
    return n, depth - n.start


def _mark(
    node: Node,
    k: int,
    i: int,
    gen_from: int,
    logprobs: npt.NDArray[np.float64],
    versions: npt.NDArray[np.int64],
    count: int,
) -> None:
    """Record positions node[k:k+count] (= seq[i:i+count]) as generated where they fall in
    the completion; the first call in file order to generate a position keeps its data."""
    lo = max(i, gen_from)
    hi = i + count
    if lo >= hi:
        return
    a, b = k + (lo - i), k + (hi - i)
    fresh = ~node.generated[a:b]
    if not fresh.any():
        return
    c0, c1 = lo - gen_from, hi - gen_from
    node.logprob[a:b][fresh] = logprobs[c0:c1][fresh]
    node.version[a:b][fresh] = versions[c0:c1][fresh]
    node.generated[a:b] |= True


def build_trees(rollouts: Iterable[Rollout]) -> dict[str, PrefixTree]:
    """One tree per group, in order of first appearance; streams the rollouts."""
    trees: dict[str, PrefixTree] = {}
    for r in rollouts:
        tree = trees.get(r.group_id)
        if tree is None:
            tree = trees[r.group_id] = PrefixTree(r.group_id)
        tree.add(r)
    return trees
