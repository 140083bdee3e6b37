"""An external agent's run on the dashboard: the example ReAct agent (only ``openai``
inside, examples/react_agent) launched through the platform's API, trained by a real run,
its reward curve and its trees on the run page like any run's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import login, shot
from tests.e2e.test_dashboard import _api_post

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "react_agent" / "config.yaml"


def _config() -> dict[str, Any]:
    """The example's config, smaller: 2 steps of 2 sessions with shorter replies, and a
    context budget low enough that each session compacts (its tree branches)."""
    d = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    d["steps"] = 2
    d["rollout"].update(
        tasks_per_step=1, group_size=2, max_new_tokens=128,
        agent_command="python examples/react_agent/agent.py --context-budget 500",
    )  # fmt: skip
    return d


def test_the_example_agents_run_shows_its_reward_curve_and_trees(page, server):
    login(page, server, "demo", "demo-pass")
    run = _api_post(page, server, "/api/runs/",
                    {"experiment": server.seed["experiment"], "name": "react-agent",
                     "config": _config()})  # fmt: skip
    page.goto(f"{server.url}/#/runs/{run['id']}")
    page.wait_for_function(
        "() => ['succeeded','failed','cancelled'].includes("
        "document.querySelector('[data-testid=run-status]')?.textContent)",
        timeout=600_000,
    )
    assert page.text_content("[data-testid=run-status]") == "succeeded"
    page.wait_for_selector("[data-testid=metrics] >> text=reward")
    trees = page.request.get(f"{server.url}/api/trees/?run={run['id']}").json()["results"]
    assert trees and max(t["dedup_ratio"] for t in trees) > 1.0  # the sessions share prefixes
    page.reload()
    page.click(".tree-list button >> nth=0")
    page.wait_for_selector("[data-testid=tree-rows] .tree-row")
    page.click("[data-testid=tree-rows] .tree-row >> button[aria-label=expand] >> nth=0")
    page.wait_for_selector("[data-testid=tree-rows] .badge.kind-branch")  # a compaction
    shot(page, "run-agent")
