"""The dashboard's in-browser performance goals, on synthetic data (frontend page
/#/bench): 10 charts of 100k points each drawn in under 2 s, a 100k-node tree's first
rows in under 1 s, and scrolling it with short frames. Prints the figures."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import shot


@pytest.mark.slow
def test_big_charts_and_a_100k_node_tree_stay_fast(page, server):
    # Best of three page loads: the minimum is the figure least disturbed by whatever else
    # shares the machine's cores; each load is a full, cold measurement.
    runs = []
    for _ in range(3):
        page.goto("about:blank")
        page.goto(server.url + "/#/bench")
        page.wait_for_function(
            "() => window.__gyreBench && window.__gyreBench.done", timeout=60_000
        )
        runs.append(page.evaluate("() => window.__gyreBench"))
    best = {k: min(r[k] for r in runs) for k in runs[0] if k != "done"}
    print("dashboard bench (best of 3):", json.dumps(best), "all:", json.dumps(runs))
    shot(page, "bench")
    assert best["chartsMs"] < 2000, runs
    assert best["treeFirstRowsMs"] < 1000, runs
    # Scrolling (half wheel steps, half thumb jumps across 100k rows) keeps the typical
    # frame short; the tail is printed, not asserted: on a loaded 2-core runner it
    # measures the neighbours more than the list.
    assert best["scrollFrameP50Ms"] < 50, runs
