"""Per-token detail of one tree node, read from the tree's payload file: token ids, their
text (with the run's tokenizer, when it has one), and per token whether it was generated,
its log-probability, the policy version that produced it and its advantage (loss weight).

The tree is rebuilt from the payload with ``gyre_core.trajectory.tree`` and kept in a small
in-process LRU, so clicking through one tree's nodes reads the file once. A node row is
found in the rebuilt tree by its path key: the key's ordinals are the child positions in
the order ``payloads.node_specs`` stored them.
"""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings

from gyre_core.trajectory.format import TrajectoryFormatError, read_rollouts
from gyre_core.trajectory.rewards import assign_weights
from gyre_core.trajectory.tree import Node, PrefixTree, build_trees
from gyre_web.trajectories.models import Tree, TreeNode
from gyre_web.trajectories.payloads import Decode, node_advantage, payload_folder
from gyre_web.trajectories.services import KEY_WIDTH

MAX_TOKENS = 20_000  # tokens one answer carries; a longer node is cut (``truncated``)
TOKENIZER_FILE = "tokenizer.json"


# --------------------------------------------------------------------------- tokenizer


def _model_tokenizer(run_id: int, config: dict[str, Any]) -> Path | None:
    """The tokenizer of the run's model: the configured checkpoint, or the tiny model the
    real runtime builds in the run's work folder."""
    checkpoint = str((config.get("model") or {}).get("checkpoint") or "")
    folder = (
        Path(checkpoint) if checkpoint else Path(settings.GYRE_RUNS_DIR) / str(run_id) / "model"
    )
    path = folder / TOKENIZER_FILE
    return path if path.is_file() else None


def tokenizer_path(*, run_id: int) -> Path | None:
    """The copy kept with the payloads first (it outlives the work folder), then the model's."""
    kept = payload_folder(run_id) / TOKENIZER_FILE
    if kept.is_file():
        return kept
    from gyre_web.runs.models import Run

    run = Run.objects.filter(pk=run_id).values("config", "backend").first()
    if run is None or run["backend"] != "real":
        return None  # a simulated run or an import: its tokens have no tokenizer here
    return _model_tokenizer(run_id, run["config"] or {})


def save_tokenizer(*, run_id: int) -> None:
    """Keep the run's tokenizer beside its payloads (once)."""
    kept = payload_folder(run_id) / TOKENIZER_FILE
    source = None if kept.is_file() else tokenizer_path(run_id=run_id)
    if source is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(kept)


@lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int) -> Any:
    import tokenizers

    return tokenizers.Tokenizer.from_file(path)


def _load(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        return _tokenizer(str(path), path.stat().st_mtime_ns)
    except Exception:  # a tokenizer file this library cannot read: show ids
        return None


def run_decoder(*, run_id: int) -> Decode | None:
    tok = _load(tokenizer_path(run_id=run_id))
    if tok is None:
        return None
    return lambda ids: str(tok.decode(ids, skip_special_tokens=False))


# --------------------------------------------------------------------------- trees


@lru_cache(maxsize=8)
def _tree(path: str, group_id: str, mtime_ns: int) -> PrefixTree | None:
    tree = build_trees(r for r in read_rollouts(path) if r.group_id == group_id).get(group_id)
    if tree is not None:
        assign_weights(tree)  # as payloads.node_specs did when the rows were stored
    return tree


def _find(tree: PrefixTree, key: str) -> Node | None:
    node = tree.root
    for i in range(0, len(key), KEY_WIDTH):
        kids = list(node.children.values())
        nth = int(key[i : i + KEY_WIDTH], 36)
        if nth >= len(kids):
            return None
        node = kids[nth]
    return node if node is not tree.root else None


def read_node_tokens(*, tree: Tree, node: TreeNode) -> dict[str, Any]:
    """The node's tokens as parallel lists (``payload`` false, lists empty, when the tree
    has no readable payload or the payload does not hold this node)."""
    out: dict[str, Any] = {
        "node": node.pk, "token_start": node.token_start, "token_end": node.token_end,
        "advantage": node.advantage, "payload": False, "decoded": False, "truncated": False,
        "text": None, "ids": [], "pieces": None, "generated": [], "logprobs": [],
        "versions": [], "advantages": [],
    }  # fmt: skip
    core = _node_of(tree, node)
    if core is None:
        return out
    n = min(len(core), MAX_TOKENS)
    ids = [int(t) for t in core.tokens[:n]]
    gen = core.generated[:n]
    out.update(
        payload=True,
        truncated=n < len(core),
        ids=ids,
        generated=[bool(g) for g in gen],
        logprobs=_where(gen, [round(float(x), 6) for x in core.logprob[:n]]),
        versions=_where(gen, [int(v) for v in core.version[:n]]),
        advantages=_where(gen, [round(float(w), 6) for w in core.weight[:n]]),
        advantage=node.advantage if node.advantage is not None else node_advantage(core),
    )
    tok = _load(tokenizer_path(run_id=tree.run_id))
    if tok is not None:
        pieces = tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        text = tok.decode(ids, skip_special_tokens=False)
        out.update(decoded=True, text=str(text), pieces=[str(p) for p in pieces])
    return out


def _where(generated: Any, values: list[Any]) -> list[Any]:
    return [v if g else None for v, g in zip(values, generated, strict=True)]


def _node_of(tree: Tree, node: TreeNode) -> Node | None:
    if not tree.payload_path:
        return None
    path = Path(tree.payload_path)
    try:
        core = _tree(str(path), tree.group_id, path.stat().st_mtime_ns)
    except (OSError, TrajectoryFormatError):
        return None
    found = _find(core, node.path_key) if core is not None else None
    if found is None or (found.start, found.end) != (node.token_start, node.token_end):
        return None  # the file does not hold the tree these rows were made from
    return found
