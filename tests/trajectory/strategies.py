"""Hypothesis strategies: small random branching logs with heavy token sharing."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from gyre_core.trajectory.format import FORMAT, KINDS, STATUSES, Rollout, parse_rollout


@st.composite
def rollout_dicts(draw: st.DrawFn, rid: str, group: str, vocab: int = 3) -> dict[str, Any]:
    tok = st.integers(0, vocab - 1)
    calls: list[dict[str, Any]] = []
    full: dict[str, int] = {}
    for j in range(draw(st.integers(1, 5))):
        cid = f"c{j}"
        call: dict[str, Any] = {"call_id": cid, "kind": draw(st.sampled_from(KINDS))}
        head = 0
        if calls and draw(st.booleans()):
            ref = draw(st.sampled_from(sorted(full)))
            head = draw(st.integers(0, full[ref]))
            call["prefix"] = {"call_id": ref, "tokens": head}
        prompt = draw(st.lists(tok, min_size=0 if head else 1, max_size=5))
        completion = draw(st.lists(tok, max_size=5))
        call["prompt_ids"] = prompt
        call["completion_ids"] = completion
        call["logprobs"] = [-(0.1 + (k + j) % 7 / 10) for k in range(len(completion))]
        call["versions"] = draw(
            st.lists(st.integers(0, 4), min_size=len(completion), max_size=len(completion))
        )
        full[cid] = head + len(prompt) + len(completion)
        calls.append(call)
    return {
        "format": FORMAT,
        "rollout_id": rid,
        "task_id": "t",
        "group_id": group,
        "status": draw(st.sampled_from(STATUSES)),
        "progress": draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        "calls": calls,
    }


@st.composite
def logs(draw: st.DrawFn, max_rollouts: int = 6) -> list[Rollout]:
    n = draw(st.integers(1, max_rollouts))
    groups = draw(st.integers(1, 3))
    return [
        parse_rollout(draw(rollout_dicts(f"r{i}", f"g{draw(st.integers(0, groups - 1))}")))
        for i in range(n)
    ]
