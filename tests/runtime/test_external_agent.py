"""The example external agent (examples/react_agent: only ``openai`` inside) trained by a real
run under elastic, with the example's config: roles switch, calls in flight migrate with
their tokens, no session restarts, and its compactions branch the trees the trainer trains
on.

The run is the example's config with one change: groups of one (8 tasks a step instead of 2
groups of 4). With groups, ``arrival`` trains only whole groups, so the first batch is ready
only once its two groups' last members are done; by then the sessions still running often
sit on one engine, and elastic takes the engines with the fewest calls in flight, which
then hold none (0 calls migrated in two of five runs of the example as it is). With groups
of one the batch is the first 8 sessions to finish and 16 are still in flight on every
engine when units move."""

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
    r = d["rollout"]
    r["tasks_per_step"], r["group_size"] = r["tasks_per_step"] * r["group_size"], 1
    sink = ListSink()
    out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == d["steps"]
    assert out["role_switches"] >= 1 and out["sessions_restarted"] == 0
    assert out["calls_migrated"] >= 1, out
    kinds = [e.kind for e in sink.events]
    assert kinds.count("step_finished") == d["steps"] and "tree_ready" in kinds
    rollouts = {
        x.rollout_id: x
        for p in sorted((tmp_path / "rollouts").glob("step-*.jsonl"))
        for x in read_rollouts(p)
    }
    assert len(rollouts) == d["steps"] * r["tasks_per_step"] * r["group_size"]
    assert all(x.extra["agent"] == "external" and x.calls for x in rollouts.values())
    assert any(c.kind == "branch" for x in rollouts.values() for c in x.calls)  # compactions
    assert out["dedup_vs_call"] > 1.0  # the trees share the agents' prefixes
    moved = {e.rollout_id for e in sink.events if e.kind == "call_migrated"}
    assert moved and moved <= set(rollouts)  # the moved sessions went on and were trained
    for rid in moved:  # every call of a moved session kept its tokens and their versions
        calls = rollouts[rid].calls
        assert all(
            len(c.completion_ids) and len(c.versions) == len(c.completion_ids) for c in calls
        )
        assert rollouts[rid].status != "failed"  # the agent never saw the move
