"""A sweep in real Chromium: launched from the Sweep page (a refused value first, its
field named), four real CPU runs of the demo recipe (configs/demo.yaml, cut to 2 steps)
at most two at once, then the compare page's table sorted by a column and its chart.
Screenshots: docs/screenshots/sweep-launch.png and sweep.png."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, Server, login, shot

pytestmark = pytest.mark.slow
ACTIVE = ("queued", "starting", "running")


def demo_config() -> dict[str, Any]:
    """configs/demo.yaml (the warm-started learning recipe) cut to 2 steps and a 4-task
    benchmark at the end: about half a minute a run on a CPU."""
    config = yaml.safe_load(Path(ROOT / "configs" / "demo.yaml").read_text())
    config.update(name="sweep-demo", steps=2, checkpoint_every=2)
    config["rollout"].update(
        tasks_per_step=1, group_size=4, benchmark_tasks=4, benchmark_samples=1,
        benchmark_every=0, max_turns=8,
    )  # fmt: skip
    return config


def _get(page: Any, server: Server, path: str) -> Any:
    resp = page.request.get(server.url + path)
    assert resp.ok, f"GET {path}: {resp.status}"
    return resp.json()


def test_a_sweep_launched_from_its_page_runs_capped_and_compares_sorted(page, server):
    login(page, server, "demo", "demo-pass")
    page.goto(server.url + "/#/sweep")
    page.wait_for_selector("[data-testid=sweep-form]")
    page.wait_for_function(  # the presets are in: the default config fills the box
        "() => document.querySelector('textarea[name=base-config]').value !== '{}'"
    )
    page.fill("input[name=sweep-name]", "lr x seed")
    page.fill("textarea[name=base-config]", json.dumps(demo_config(), indent=2))
    page.fill("input[name=field-0]", "train.lr")
    page.fill("input[name=values-0]", "1e-4, -1")
    page.fill("input[name=field-1]", "seed")
    page.fill("input[name=values-1]", "0, 1")
    page.fill("input[name=max_concurrent]", "2")
    page.click("[data-testid=launch-sweep]")
    error = page.wait_for_selector("[data-testid=sweep-error]")
    assert 'params["train.lr"]' in error.text_content() and "-1" in error.text_content()
    page.fill("input[name=values-0]", "1e-4, 1e-3")
    shot(page, "sweep-launch")
    page.click("[data-testid=launch-sweep]")
    page.wait_for_url("**/compare?sweep=*")
    sweep_id = int(page.url.rsplit("=", 1)[1])

    # The cap: never more than 2 of its runs launched and not ended (the worker here is a
    # single solo process: of those 2, one runs and one waits in the broker's queue).
    deadline, most = time.monotonic() + 420, 0
    while True:
        sweep = _get(page, server, f"/api/sweeps/{sweep_id}/")
        started = sum(r["launched"] and r["status"] in ACTIVE for r in sweep["runs"])
        most = max(most, started)
        assert started <= 2, sweep["runs"]
        if sweep["status"] != "running":
            break
        assert time.monotonic() < deadline, f"the sweep did not finish: {sweep['runs']}"
        time.sleep(1.0)
    assert len(sweep["runs"]) == 4 and most == 2
    assert {r["status"] for r in sweep["runs"]} == {"succeeded"}, sweep["runs"]
    assert all(r["steps"] == 2 for r in sweep["runs"]), sweep["runs"]
    assert all(r["score"] is not None and r["benchmark_step"] == 2 for r in sweep["runs"]), sweep[
        "runs"
    ]

    page.wait_for_selector("[data-testid=sweep-status] >> text=finished", timeout=30_000)
    rows = page.locator("[data-testid=sweep-table] tbody tr")
    assert rows.count() == 4
    page.click("[data-testid=sweep-table] th[data-key=score]")  # best first
    got = [float(rows.nth(i).locator("td").nth(4).text_content().split("@")[0]) for i in range(4)]
    assert got == sorted(got, reverse=True)
    page.click("[data-testid=sweep-table] th[data-key='values.train.lr']")
    lrs = [rows.nth(i).locator("td").nth(1).text_content() for i in range(4)]
    assert lrs == ["0.0001", "0.0001", "0.001", "0.001"]
    page.wait_for_selector("[data-testid=sweep] .uplot")  # the chart of the scores
    # the compare page below overlays the four runs' metrics
    page.wait_for_selector(f"[data-testid=compare-timeline-{sweep['runs'][3]['run']}]")
    shot(page, "sweep")
    listed = _get(page, server, f"/api/sweeps/?experiment={sweep['experiment']}")
    assert sweep_id in [s["id"] for s in listed["results"]]
