"""Bounded path sampling (``train.max_paths``, J_max): which paths of a tree a step trains.

Per execution (a rollout ``r`` of the group's tree) the candidate leaves are the ends of
``r``'s branches (:func:`~gyre_core.trajectory.rewards.branch_ends`). Each has a *role*,
read from the calls of ``r`` that end there (:func:`leaf_role`): ``main``, ``main_summary``
(the main agent's compaction summary), ``subagent`` and ``subagent_summary``. A leaf's
*untaken trainable tokens* are the positions on its root-to-leaf path that ``r`` generated
and that no earlier draw of ``r`` took. One draw: the first role in the order
(``train.path_roles``) that has a leaf with untaken trainable tokens; among that role's
leaves, one drawn with probability proportional to them; its path taken. Draws repeat until
``r`` has no untaken trainable token of a listed role or ``max_paths`` paths of ``r`` are
taken. Each execution draws from its own generator, seeded from (run seed, policy version
trained, group id, rollout id), so the tree browser draws the same paths again.

The positions some execution took get ``Node.taken`` True, every other position False (the
packer trains ``generated & taken``). Then the tree is *pruned*: a subtree with no taken
generated position leaves the tree, so packing and the forward-backward skip it; an
ancestor that a taken path runs through stays, as context. Pruning only detaches nodes:
``tree.calls`` and ``tree.rollouts`` keep every call, a pruned call's ``node`` is no longer
reachable from the root (its parent links stay, so ``branch_ends`` still reads it), and a
tree where nothing was taken is left whole (it trains nothing). ``tree.taken_paths`` lists
each execution's drawn leaves in draw order.

A position several executions generated keeps the weight its advantage mode gave it from
all of them, whichever of them took it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_core.trajectory.rewards import branch_ends
from gyre_core.trajectory.tree import CallRef, Node, PrefixTree

ROLES = ("main", "main_summary", "subagent", "subagent_summary")
DEFAULT_ROLES = ",".join(ROLES)
MAIN = "main"  # the agent name of the main agent (the format's default)
Mask = npt.NDArray[np.bool_]


def parse_roles(text: str) -> tuple[str, ...]:
    """``"main,subagent"`` -> ``("main", "subagent")``: distinct names out of :data:`ROLES`."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in ROLES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(
            f"path roles must be distinct names out of {', '.join(ROLES)} "
            f"(comma-separated, at least one), got {text!r}"
        )
    return names


@dataclass(frozen=True, slots=True)
class PathSampling:
    """How many paths of each execution a step trains (0: all) and the roles' order (a
    role left out is never trained). A run's are ``train.max_paths`` and ``train.path_roles``."""

    max_paths: int = 0
    roles: tuple[str, ...] = ROLES

    def __post_init__(self) -> None:
        if self.max_paths < 0:
            raise ValueError(f"max_paths must be >= 0, got {self.max_paths}")
        parse_roles(",".join(self.roles))

    @classmethod
    def of(cls, max_paths: int, roles: str) -> PathSampling:
        return cls(max_paths, parse_roles(roles))

    @property
    def everything(self) -> bool:
        """Every path of every role: the tree is trained whole and left untouched."""
        return self.max_paths == 0 and set(self.roles) == set(ROLES)

    def apply(self, tree: PrefixTree, seed: int, version: int) -> None:
        """Draw the paths, set ``Node.taken``, prune (see the module docstring)."""
        if self.everything:
            return
        draw(tree, self, seed, version)
        prune(tree)


def rng_for(seed: int, version: int, group_id: str, rollout_id: str) -> np.random.Generator:
    """The generator of one execution's draws: a function of these four only."""
    digest = hashlib.sha256(f"{group_id}\0{rollout_id}".encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return np.random.default_rng([seed % 2**32, version % 2**32, *words])


def _restarts(tree: PrefixTree, call: CallRef, earlier: CallRef | None) -> bool:
    """Whether ``call`` does not extend ``earlier`` (its agent's previous call): it starts
    a new context, as a compaction's resumed call does."""
    if earlier is None:
        return False
    n: Node | None = call.node
    while n is not None and n.end > earlier.full_len:
        n = n.parent
    return n is not earlier.node


def leaf_role(tree: PrefixTree, c: int, nxt: int | None) -> str:
    """The role of a leaf that call ``c`` ends; ``nxt``: its agent's next call in the
    rollout. A summary is a call labelled ``compaction`` that extends its agent's context
    (Gyre's harness labels the call writing the summary so), or a call whose agent's next
    call is labelled ``compaction`` and starts a new context from it (the synthetic logs
    label the resumed call so); see docs/trajectory-format.md."""
    call = tree.calls[c]
    prev = _previous(tree, c)
    summary = call.kind == "compaction" and not _restarts(tree, call, prev)
    if nxt is not None and tree.calls[nxt].kind == "compaction":
        summary = summary or _restarts(tree, tree.calls[nxt], call)
    sub = call.agent != MAIN
    return ("subagent" if sub else "main") + ("_summary" if summary else "")


def _previous(tree: PrefixTree, c: int) -> CallRef | None:
    call = tree.calls[c]
    mine = tree.rollouts[call.rollout].calls
    before = [i for i in mine[: mine.index(c)] if tree.calls[i].agent == call.agent]
    return tree.calls[before[-1]] if before else None


def generated_by(tree: PrefixTree) -> dict[int, dict[Node, Mask]]:
    """Per rollout, per node, the positions that rollout's calls generated."""
    out: dict[int, dict[Node, Mask]] = defaultdict(dict)
    for c in tree.calls:
        n: Node | None = c.node
        while n is not None and n is not tree.root and n.end > c.prompt_len:
            m = out[c.rollout].setdefault(n, np.zeros(len(n), dtype=bool))
            m[max(0, c.prompt_len - n.start) :] = True
            n = n.parent
    return out


def candidates(tree: PrefixTree) -> dict[int, list[tuple[Node, str]]]:
    """Per rollout, its branch ends in the tree's preorder, each with its role (that of the
    first call of the rollout, in file order, ending there)."""
    order = {n: i for i, n in enumerate(tree.nodes())}
    out: dict[int, list[tuple[Node, str]]] = {}
    for r, ends in branch_ends(tree).items():
        calls = tree.rollouts[r].calls
        role: dict[Node, str] = {}
        for j, c in enumerate(calls):
            node = tree.calls[c].node
            if node in ends and node not in role:
                agent = tree.calls[c].agent
                nxt = next((d for d in calls[j + 1 :] if tree.calls[d].agent == agent), None)
                role[node] = leaf_role(tree, c, nxt)
        out[r] = sorted(role.items(), key=lambda kv: order[kv[0]])
    return out


def draw_rollout(
    tree: PrefixTree,
    leaves: list[tuple[Node, str]],
    gen: dict[Node, Mask],
    sampling: PathSampling,
    rng: np.random.Generator,
) -> tuple[list[Node], dict[Node, Mask]]:
    """One execution's draws -> its taken leaves (in draw order) and taken positions."""
    taken: dict[Node, Mask] = {n: np.zeros(len(n), dtype=bool) for n in gen}
    paths = {leaf: [n for n in tree.path(leaf) if n in gen] for leaf, _ in leaves}
    picked: list[Node] = []
    while sampling.max_paths == 0 or len(picked) < sampling.max_paths:
        left = {n: int((gen[n] & ~taken[n]).sum()) for n in gen}
        counts = [(leaf, role, sum(left[n] for n in paths[leaf])) for leaf, role in leaves]
        pool: list[tuple[Node, int]] = []
        for role in sampling.roles:
            pool = [(leaf, k) for leaf, r, k in counts if r == role and k > 0]
            if pool:
                break
        if not pool:
            break
        weights = np.asarray([k for _, k in pool], dtype=np.float64)
        i = int(rng.choice(len(pool), p=weights / weights.sum()))
        leaf = pool[i][0]
        for n in paths[leaf]:
            taken[n] |= gen[n]
        picked.append(leaf)
    return picked, taken


def draw(tree: PrefixTree, sampling: PathSampling, seed: int, version: int) -> None:
    """Every execution's draws; sets ``Node.taken`` and ``tree.taken_paths``."""
    gen = generated_by(tree)
    for n in tree.nodes():
        n.taken[:] = False
    tree.taken_paths = {}
    for r, leaves in candidates(tree).items():
        info = tree.rollouts[r]
        rng = rng_for(seed, version, tree.group_id, info.rollout_id)
        picked, taken = draw_rollout(tree, leaves, gen[r], sampling, rng)
        tree.taken_paths[r] = picked
        for n, m in taken.items():
            n.taken |= m


def prune(tree: PrefixTree) -> None:
    """Detach every subtree with no taken generated position (a tree where nothing was
    taken is left whole)."""
    keep: dict[Node, bool] = {}
    for n in reversed(list(tree.nodes())):  # children before their parent
        keep[n] = bool((n.generated & n.taken).any()) or any(keep[c] for c in n.children.values())
    if not any(keep[c] for c in tree.root.children.values()):
        return
    for n in [tree.root, *keep]:
        if n is tree.root or keep[n]:
            n.children = {t: c for t, c in n.children.items() if keep[c]}


PATH_FIGURES = ("paths_taken", "paths_total", "tokens_trained", "tokens_stored", "tokens_context")


def path_figures(trees: Iterable[PrefixTree]) -> dict[str, float]:
    """A batch's accounting: ``paths_taken`` of ``paths_total`` (branch ends, over every
    execution), ``tokens_trained`` (taken generated positions) of ``tokens_stored``
    (generated positions before sampling), ``tokens_context`` (positions left in the trees
    that are not trained: prompts, tool outputs, untaken positions a taken path shares)."""
    out = dict.fromkeys(PATH_FIGURES, 0)
    for tree in trees:
        total = sum(len(e) for e in branch_ends(tree).values())
        out["paths_total"] += total
        sampled = tree.taken_paths
        out["paths_taken"] += total if sampled is None else sum(len(p) for p in sampled.values())
        every: set[Node] = set()  # every node, pruned ones included: those on a call's path
        for c in tree.calls:
            n: Node | None = c.node
            while n is not None and n is not tree.root and n not in every:
                every.add(n)
                n = n.parent
        out["tokens_stored"] += sum(int(n.generated.sum()) for n in every)
        for n in tree.nodes():
            trained = int((n.generated & n.taken).sum())
            out["tokens_trained"] += trained
            out["tokens_context"] += len(n) - trained
    return {k: float(v) for k, v in out.items()}
