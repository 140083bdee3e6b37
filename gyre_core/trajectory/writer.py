"""Writing ``gyre.trajectory/v1``: one rollout per line, calls linked by ``prefix``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from gyre_core.trajectory.format import FORMAT, Call, Prefix, Rollout
from gyre_core.trajectory.tree import CallRef, PrefixTree


def rollout_to_json(rollout: Rollout, *, exact: bool = False, extra: bool = True) -> dict[str, Any]:
    """The JSON object of one rollout, its calls written as given. ``exact``: log-probs
    printed back exactly (float64) and versions always a list, instead of log-probs
    rounded to 6 places and one version where all tokens share it; ``extra``: keep the
    rollout's unknown top-level keys (a file's own, kept by the reader)."""
    calls = []
    for c in rollout.calls:
        d: dict[str, Any] = {"call_id": c.call_id, "agent": c.agent, "kind": c.kind}
        if c.prefix is not None:
            d["prefix"] = {"call_id": c.prefix.call_id, "tokens": c.prefix.tokens}
        d["prompt_ids"] = c.prompt_ids.tolist()
        d["completion_ids"] = c.completion_ids.tolist()
        logprobs = c.logprobs.tolist()
        d["logprobs"] = logprobs if exact else [round(x, 6) for x in logprobs]
        v = c.versions
        uniform = not exact and len(v) and (v == v[0]).all()
        d["versions"] = int(v[0]) if uniform else v.tolist()
        calls.append(d)
    out: dict[str, Any] = {
        "format": FORMAT,
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "group_id": rollout.group_id,
        "status": rollout.status,
        "progress": rollout.progress,
        "reward": rollout.score,
    }
    if rollout.failure:
        out["failure"] = rollout.failure
    if extra:
        out.update(rollout.extra)
    out["calls"] = calls
    return out


def with_prefixes(rollout: Rollout) -> Rollout:
    """Rewrite each call given with its whole prompt (no ``prefix``) so that, when it
    shares a start with an earlier call of the rollout, it names as ``prefix`` the most
    recent call that shares the most tokens. Calls that have a prefix keep it.

    Matching runs on the rollout's own prefix tree, so it is linear in the tokens."""
    tree = PrefixTree(rollout.group_id)
    r = tree.start_rollout(rollout)
    by_id: dict[str, CallRef] = {}
    calls: list[Call] = []
    for c in rollout.calls:
        if c.prefix is None:
            node, k = tree.match(c.prompt_ids)
            depth = node.start + k
            if depth:
                last = max(tree.calls_through(node))
                ref = Prefix(tree.calls[last].call_id, depth)
                c = Call(
                    c.call_id,
                    c.prompt_ids[depth:].copy(),
                    c.completion_ids,
                    c.logprobs,
                    c.versions,
                    c.agent,
                    c.kind,
                    ref,
                )
        calls.append(c)
        tree.add_call(r, c, by_id)
    return Rollout(
        rollout.rollout_id,
        rollout.task_id,
        rollout.status,
        rollout.progress,
        calls,
        rollout.group_id,
        rollout.reward,
        dict(rollout.extra),
        rollout.failure,
    )


def write_rollouts(
    dest: str | Path | IO[str], rollouts: Iterable[Rollout], *, compress: bool = True
) -> int:
    """Write rollouts as JSONL; with ``compress`` every call that shares a start with an
    earlier call is written with ``prefix``. Returns the number of rollouts written."""
    if isinstance(dest, str | Path):
        with open(dest, "w", encoding="utf-8") as fh:
            return write_rollouts(fh, rollouts, compress=compress)
    n = 0
    for r in rollouts:
        obj = rollout_to_json(with_prefixes(r) if compress else r)
        dest.write(json.dumps(obj, separators=(",", ":")) + "\n")
        n += 1
    return n
