"""A run's log lines in the dashboard (real Chromium, embedded-mode server and worker):
a launched sim run's worker and runtime lines show on its page, the search box narrows
them and the level filter hides the info lines. Screenshot: docs/screenshots/logs.png."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_dashboard import _launch_by_api, _wait_finished

pytestmark = pytest.mark.slow


def test_the_run_page_shows_searches_and_filters_the_log(page, server):
    login(page, server, "demo", "demo-pass")
    run_id = _launch_by_api(page, server)
    page.goto(f"{server.url}/#/runs/{run_id}")
    _wait_finished(page)
    lines = page.locator("[data-testid=logs] [data-testid=log-line]")
    page.wait_for_selector(f"[data-testid=logs] >> text=run {run_id} succeeded at step")
    assert lines.count() >= 3
    text = page.text_content("[data-testid=logs]") or ""
    assert f"run {run_id} started at step 0" in text and "runtime" in text
    assert "sim: 256 xlong rollouts on 64 GPUs" in text
    page.locator("[data-testid=logs]").scroll_into_view_if_needed()
    shot(page, "logs")

    page.fill("[data-testid=logs-search]", "ROLLOUTS ON 64")
    page.press("[data-testid=logs-search]", "Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=logs] [data-testid=log-line]').length === 1"
    )
    assert "sim: 256 xlong rollouts" in (lines.first.text_content() or "")

    page.fill("[data-testid=logs-search]", "")
    page.press("[data-testid=logs-search]", "Enter")
    page.select_option("[data-testid=logs-level]", "warning")
    page.wait_for_selector("[data-testid=logs] >> text=no log lines match")
    assert lines.count() == 0
