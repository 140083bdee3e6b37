"""The example external agent (examples/react_agent: only ``openai`` inside) trained by a real
run under elastic: roles switch, calls migrate with their tokens, no session restarts, and
its compactions branch the trees the trainer trains on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from gyre_core.trajectory.format import read_rollouts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "react_agent" / "config.yaml"


def test_the_example_agent_trains_under_elastic(ray_cluster, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(ROOT)  # the example's command names its script from the repository root
    d = yaml.safe_load(EXAMPLE.read_text())
    # longer calls, more sessions at once: a unit leaving rollout has calls to migrate
    d["steps"] = 2
    d["rollout"].update(tasks_per_step=2, token_budget=4096)
    # a lower context budget than the example's: a compaction within 8 calls even when the
    # model ends some replies early
    d["rollout"]["agent_command"] = d["rollout"]["agent_command"].replace("1000", "900")
    assert "--context-budget 900" in d["rollout"]["agent_command"]
    sink = ListSink()
    out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == d["steps"]
    assert out["role_switches"] >= 1 and out["sessions_restarted"] == 0
    kinds = [e.kind for e in sink.events]
    assert kinds.count("step_finished") == d["steps"] and "tree_ready" in kinds
    rollouts = [
        r for p in sorted((tmp_path / "rollouts").glob("step-*.jsonl")) for r in read_rollouts(p)
    ]
    assert len(rollouts) == d["steps"] * 2 * d["rollout"]["group_size"]
    assert all(r.extra["agent"] == "external" and r.calls for r in rollouts)
    assert any(c.kind == "branch" for r in rollouts for c in r.calls)  # compactions
    assert out["dedup_vs_call"] > 1.0  # the trees share the agents' prefixes


def test_endpoint_sessions_migrate_with_their_tokens_under_elastic(ray_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An agent named by import path whose sessions differ in length (one call, or six long
    ones): the first batch is ready while the long sessions are mid-call on every engine,
    elastic harvests an engine for training, and the calls on it move with their tokens."""
    d = yaml.safe_load(EXAMPLE.read_text())
    d["rollout"].pop("agent_command")
    d["steps"] = 2
    d["scheduler"]["elastic_train_share"] = 0.25  # 3 engines at the start
    d["rollout"].update(agent="tests.runtime.agents:varied", tasks_per_step=2, group_size=4,
                        max_turns=12, max_new_tokens=512, token_budget=8192)  # fmt: skip
    sink = ListSink()
    out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["sessions_restarted"] == 0
    assert out["calls_migrated"] >= 1, out
    moved = {e.rollout_id for e in sink.events if e.kind == "call_migrated"}
    rollouts = {
        r.rollout_id: r
        for p in (tmp_path / "rollouts").glob("step-*.jsonl")
        for r in read_rollouts(p)
    }
    assert moved and moved <= set(rollouts)  # the moved sessions went on and were trained
    for rid in moved:
        assert len(rollouts[rid].calls) == 6  # every call of the session, none restarted
        assert all(len(c.versions) == len(c.completion_ids) for c in rollouts[rid].calls)
