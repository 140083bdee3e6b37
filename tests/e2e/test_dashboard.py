"""The dashboard in real Chromium against a real embedded-mode server (see conftest.py):
sign in, launch a simulated run and watch it fill, share it and open the link signed out,
and a non-member is refused. Screenshots of the main pages go to docs/screenshots/."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import SHOTS, Server, login, shot
from tests.receiver import Receiver

# A real server, worker and browser: each test takes seconds to tens of seconds.
pytestmark = pytest.mark.slow

SIM = {
    "name": "e2e-sim",
    "backend": "sim",
    "scheduler": {"policy": "elastic"},
    "sim": {"gpus": 64, "rollouts": 256, "rollouts_per_step": 64},
}


def _api_post(page: Any, server: Server, path: str, data: dict[str, Any]) -> dict[str, Any]:
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    resp = page.request.post(
        server.url + path, data=data, headers={"X-CSRFToken": cookies.get("csrftoken", "")}
    )
    assert resp.ok, f"POST {path}: {resp.status} {resp.text()}"
    return resp.json()


def _launch_by_api(page: Any, server: Server, policy: str = "elastic") -> int:
    config = {**SIM, "scheduler": {"policy": policy}}
    run = _api_post(
        page, server, "/api/runs/",
        {"experiment": server.seed["experiment"], "name": "api-sim", "config": config},
    )  # fmt: skip
    return int(run["id"])


def _wait_finished(page: Any) -> None:
    page.wait_for_function(
        "() => ['succeeded','failed','cancelled'].includes("
        "document.querySelector('[data-testid=run-status]')?.textContent)",
        timeout=90_000,
    )


def test_sign_in_refuses_a_wrong_password_then_shows_the_runs(page, server):
    page.goto(server.url + "/")
    page.fill("input[name=username]", "demo")
    page.fill("input[name=password]", "not-the-password")
    page.click("button[type=submit]")
    page.wait_for_selector("text=wrong username or password")
    assert page.locator("nav >> text=Runs").count() == 0  # still signed out
    login(page, server, "demo", "demo-pass")
    page.wait_for_selector("[data-testid=runs-table]")
    assert page.locator("text=wrong username or password").count() == 0
    shot(page, "runs")


def test_launch_form_shows_errors_then_a_sim_run_fills_the_live_views(page, server):
    login(page, server, "demo", "demo-pass")
    page.goto(server.url + "/#/launch")
    page.select_option("select[aria-label=preset]", label="sim-elastic")  # configs/sim-elastic.yaml
    # Checked in the browser: a bound from the schema.
    page.fill("input[name=steps]", "0")
    page.click("[data-testid=launch]")
    page.wait_for_selector(".field.invalid >> text=must be at least 1")
    # Checked by the server: a cross-field rule the form does not know.
    page.fill("input[name=steps]", "8")
    page.fill("input[name='sim.rollouts']", "8")
    page.click("[data-testid=launch]")
    page.wait_for_selector(".field.invalid >> text=fewer than one step")
    shot(page, "launch")
    page.fill("input[name='sim.rollouts']", "256")
    page.click("[data-testid=launch]")
    page.wait_for_url(re.compile(r".*/#/runs/\d+$"))
    _wait_finished(page)
    assert page.text_content("[data-testid=run-status]") == "succeeded"
    page.wait_for_function(
        "() => Number(document.querySelector('[data-testid=finished-count]').textContent) >= 256"
    )
    units = page.get_attribute("[data-testid=role-timeline]", "data-units")
    assert units is not None and int(units) > 0
    assert page.locator("[data-testid=role-timeline] canvas.lanes").count() == 1
    assert page.locator("[data-testid=event-log] .event-row").count() > 5
    assert "live" in (page.text_content("[data-testid=stream-state]") or "")
    shot(page, "run")


def test_a_shared_run_opens_signed_out_and_read_only(page, server, browser):
    login(page, server, "demo", "demo-pass")
    run_id = _launch_by_api(page, server)
    page.goto(f"{server.url}/#/runs/{run_id}")
    _wait_finished(page)
    page.click("[data-testid=share]")
    url = page.input_value("[data-testid=share-url]")
    assert "/#/share/" in url

    stranger = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        shared = stranger.new_page()
        shared.goto(url)
        shared.wait_for_selector("[data-testid=shared-view]")
        shared.wait_for_selector(f"text=Run #{run_id}")
        shared.wait_for_function(
            "() => Number(document.querySelector('[data-testid=finished-count]')?.textContent) > 0"
        )
        assert shared.locator("button", has_text="cancel").count() == 0
        assert shared.locator("[data-testid=share]").count() == 0
        # The link reads this run only: the team list stays closed to it.
        assert shared.request.get(server.url + "/api/teams/").status in (401, 403)
        shot(shared, "shared-run")
    finally:
        stranger.close()

    page.goto(server.url + "/#/team")
    page.wait_for_selector(f"[data-testid=share-links] >> text=run {run_id}")
    shot(page, "team")


def test_a_non_member_is_refused(page, server, browser):
    owner = browser.new_context()
    try:
        p = owner.new_page()
        login(p, server, "demo", "demo-pass")
        run_id = _launch_by_api(p, server)
    finally:
        owner.close()
    login(page, server, "outsider", "outsider-pass")
    assert page.request.get(f"{server.url}/api/runs/{run_id}/").status == 404
    page.goto(f"{server.url}/#/runs/{run_id}")
    page.wait_for_selector("text=HTTP 404")
    page.goto(server.url + "/#/runs")
    page.wait_for_selector("[data-testid=runs-table]")
    assert page.locator("[data-testid=runs-table] >> text=api-sim").count() == 0


def test_a_viewer_reads_a_run_but_is_offered_no_write_controls(page, server):
    login(page, server, "watcher", "watcher-pass")  # a viewer in the demo team (seed.py)
    run_id = server.seed["tree_run"]
    page.goto(f"{server.url}/#/runs/{run_id}")
    page.wait_for_selector("button:has-text('group-0')")  # the run and its trees load
    for label in ("cancel", "pause run", "resume", "fork"):
        assert page.get_by_role("button", name=label, exact=True).count() == 0, label
    assert page.locator("[data-testid=share]").count() == 0
    assert page.request.get(f"{server.url}/api/runs/{run_id}/").json()["can_edit"] is False
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    refused = page.request.post(
        f"{server.url}/api/runs/{run_id}/cancel/",
        headers={"X-CSRFToken": cookies.get("csrftoken", "")},
    )
    assert refused.status == 403  # what the screen no longer offers, the API still refuses
    page.goto(server.url + "/#/runs")
    page.wait_for_selector(f"[aria-label='select run {run_id}']")
    page.wait_for_selector("select[aria-label=team] option:has-text('demo')", state="attached")
    assert page.locator("button", has_text="cancel selected").count() == 0
    assert page.locator(".filters a", has_text="launch").count() == 0
    assert page.locator("nav a", has_text="Launch").count() == 0  # the nav hides it too


def _wait_run_done(page: Any, server: Server, run_id: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        status = page.request.get(f"{server.url}/api/runs/{run_id}/").json()["status"]
        if status in ("succeeded", "failed", "cancelled"):
            assert status == "succeeded", status
            return
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} did not finish")


def test_compare_stacks_the_policies_and_cluster_renders(page, server):
    login(page, server, "demo", "demo-pass")
    elastic = _launch_by_api(page, server)
    colocate = _launch_by_api(page, server, policy="colocate")
    for run_id in (elastic, colocate):
        _wait_run_done(page, server, run_id)
    page.goto(f"{server.url}/#/compare?runs={elastic},{colocate}")
    page.wait_for_selector(f"[data-testid=compare-timeline-{colocate}]")
    # Both runs changed roles, so each gets its lanes, drawn on one time scale.
    for run_id in (elastic, colocate):
        lanes = page.locator(f"[data-testid=compare-timeline-{run_id}] canvas.lanes")
        assert lanes.count() == 1, run_id
    page.wait_for_selector("[data-testid='chart-tokens_masked']")
    shot(page, "compare")
    # By wall time: each step at its step_finished time on the run's clock.
    page.click("[data-testid=compare-x] >> text=wall time")
    page.wait_for_selector("[data-testid='chart-tokens_masked'] .u-legend th:has-text('wall time')")
    assert "x=time" in page.url
    page.goto(server.url + "/#/cluster")
    page.wait_for_selector("[data-testid=gpus]")
    shot(page, "cluster")


def test_the_tree_browser_expands_searches_and_navigates_by_keyboard(page, server):
    login(page, server, "demo", "demo-pass")
    page.goto(f"{server.url}/#/runs/{server.seed['tree_run']}")
    page.click("button:has-text('group-0')")
    rows = page.locator("[data-testid=tree-rows] .tree-row")
    page.wait_for_selector("text=task: fix the failing test")
    assert rows.count() == 1
    page.click("[data-testid=tree-rows] .tree-row >> button[aria-label=expand]")
    page.wait_for_selector("text=branch 4 (retry)")
    assert rows.count() == 6
    for kind in ("compaction", "subagent", "retry"):
        assert page.locator(f"[data-testid=tree-rows] .badge.kind-{kind}").count() >= 1
    # Aggregated mode folds the second retry into the first.
    page.check("text=collapse retries")
    page.wait_for_selector("text=+1 retries")
    page.uncheck("text=collapse retries")
    # Keyboard: down to "branch 0", right expands it (children fetched), left goes back up.
    page.focus("[data-testid=tree-rows]")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("text=tool call 5 of branch 0")  # rows past the view are virtual
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert "tool call 0 of branch 0" in page.text_content("[data-testid=tree-detail]")
    page.keyboard.press("ArrowLeft")
    assert "branch 0 (continue)" in page.text_content("[data-testid=tree-detail]")
    # Search finds a node deep in an unexpanded branch; opening it reveals and selects it.
    page.fill("[data-testid=tree-search]", "needle")
    page.press("[data-testid=tree-search]", "Enter")
    page.click("[data-testid=tree-hits] >> text=the needle is here")
    page.wait_for_selector(".tree-row.selected >> text=the needle is here")
    assert "the needle is here" in page.text_content("[data-testid=tree-detail]")


def _get(page: Any, server: Server, path: str) -> Any:
    resp = page.request.get(server.url + path)
    assert resp.ok, f"GET {path}: {resp.status}"
    body = resp.json()
    return body["results"] if isinstance(body, dict) and "results" in body else body


def test_the_tree_browser_opens_a_node_with_its_tokens(page, server):
    """The imported trajectory file (seed.py): search finds a node two levels down, and
    opening it shows its tokens decoded, the generated ones with their log-probability,
    policy version and advantage, as the tokens endpoint reads them from the payload."""
    login(page, server, "demo", "demo-pass")
    run_id = server.seed["tokens_run"]
    (tree,) = _get(page, server, f"/api/trees/?run={run_id}&group_id=grp-0-1")
    root = _get(page, server, f"/api/trees/{tree['id']}/nodes/")[0]  # (sub-agents add roots)
    deep = next(
        grandchild
        for child in _get(page, server, f"/api/trees/{tree['id']}/nodes/?parent={root['id']}")
        for grandchild in _get(page, server, f"/api/trees/{tree['id']}/nodes/?parent={child['id']}")
        if grandchild["trainable"] > 0
    )  # fmt: skip
    want = _get(page, server, f"/api/trees/{tree['id']}/nodes/{deep['id']}/tokens/")
    assert want["payload"] and want["decoded"] and any(want["generated"])
    words = " ".join(deep["preview"].split()[:2])  # decoded text, searchable

    page.goto(f"{server.url}/#/runs/{run_id}")
    page.click("button:has-text('grp-0-1')")
    page.wait_for_selector("[data-testid=tree-rows] .tree-row")
    page.locator("[data-testid=tree-rows] .tree-row >> button[aria-label=expand]").first.click()
    page.wait_for_selector("[data-testid=tree-rows] .badge.kind-compaction")  # root's children
    page.fill("[data-testid=tree-search]", words)
    page.press("[data-testid=tree-search]", "Enter")
    page.locator(f"[data-testid=tree-hits] button:has-text('{words}')").first.click()
    page.wait_for_selector(f".tree-row.selected >> text={words}")
    cells = page.locator("[data-testid=node-tokens] .tok")
    cells.first.wait_for()
    assert cells.all_text_contents() == want["pieces"]  # one decoded piece per token
    generated = page.locator("[data-testid=node-tokens] .tok.generated")
    assert generated.count() == sum(want["generated"])
    i = want["generated"].index(True)
    title = generated.first.get_attribute("title") or ""
    m = re.fullmatch(
        r"id (\d+) · generated · logprob (\S+) · version (\d+) · advantage (\S+)", title
    )
    assert m, title
    assert int(m[1]) == want["ids"][i] and int(m[3]) == want["versions"][i]
    assert abs(float(m[2]) - want["logprobs"][i]) < 1e-4
    assert abs(float(m[4]) - want["advantages"][i]) < 1e-3
    summary = page.text_content("[data-testid=node-tokens] .muted") or ""
    assert summary.startswith(f"{len(want['ids'])} tokens · {sum(want['generated'])} generated")
    adv = re.search(r"advantage (\S+)", summary)
    assert adv and abs(float(adv[1]) - want["advantage"]) < 1e-3, summary
    assert "no tokenizer" not in summary
    shot(page, "tree")


def test_fork_opens_the_form_with_the_parent_config_and_launches_a_child(page, server):
    login(page, server, "demo", "demo-pass")
    parent = _launch_by_api(page, server)
    page.goto(f"{server.url}/#/runs/{parent}")
    page.click("button:has-text('fork')")
    page.wait_for_selector(f"text=Fork run #{parent}")
    # The form holds the parent's config (its name is not the default one).
    page.wait_for_function("() => document.querySelector('input[name=name]').value === 'e2e-sim'")
    page.select_option("select[name='scheduler.policy']", "async")
    page.click("[data-testid=launch]")
    page.wait_for_url(re.compile(r".*/#/runs/\d+$"))
    child = int(page.url.rsplit("/", 1)[1])
    assert child != parent
    body = page.request.get(f"{server.url}/api/runs/{child}/").json()
    assert body["parent"] == parent and body["policy"] == "async"


def test_runs_filter_by_name_fields_and_bulk_cancel(page, server):
    login(page, server, "demo", "demo-pass")
    waiting = server.seed["waiting"]
    page.goto(server.url + "/#/runs")
    page.wait_for_selector("[data-testid=runs-table] tbody tr")
    page.select_option("select[aria-label=status]", "queued")
    # Only queued runs are listed under that filter.
    page.wait_for_function(
        "() => { const s = [...document.querySelectorAll('[data-testid=runs-table] tbody .status')]"
        ".map(e => e.textContent); return s.length > 0 && s.every(x => x === 'queued'); }"
    )
    for run_id in waiting:
        page.wait_for_selector(f"[aria-label='select run {run_id}']")
    for run_id in waiting:
        page.check(f"[aria-label='select run {run_id}']")
    page.click("button:has-text('cancel selected (2)')")
    page.wait_for_selector("text=cancel requested for 2 run(s)")
    page.select_option("select[aria-label=status]", "cancelled")
    for run_id in waiting:
        page.wait_for_selector(f"[aria-label='select run {run_id}']")
    for run_id in waiting:
        assert page.request.get(f"{server.url}/api/runs/{run_id}/").json()["status"] == "cancelled"


def test_team_page_manages_tokens_members_and_revokes_a_share_link(page, server, browser):
    login(page, server, "demo", "demo-pass")
    run_id = _launch_by_api(page, server)
    link = _api_post(page, server, "/api/share-links/", {"run": run_id})
    page.goto(server.url + "/#/team")
    # An API token: the secret is shown once, and it authenticates until revoked.
    page.fill("input[placeholder='token name']", "ci")
    page.click("button:has-text('create token')")
    secret = page.text_content("[data-testid=token-secret] code")
    assert secret
    auth = {"Authorization": f"Token {secret}"}
    assert page.request.get(server.url + "/api/teams/", headers=auth).status == 200
    page.click("[data-testid=tokens] tr:has-text('ci') >> button:has-text('revoke')")
    page.wait_for_selector("[data-testid=tokens] tr:has-text('ci') >> text=revoked")
    assert page.request.get(server.url + "/api/teams/", headers=auth).status in (401, 403)
    # A member with a role.
    page.fill("input[placeholder=username]", "newcomer")
    page.select_option("select:near(input[placeholder=username])", "viewer")
    page.click("button:has-text('add or change role')")
    page.wait_for_selector("[data-testid=members] tr:has-text('newcomer') >> text=viewer")
    # Revoking a share link closes it for whoever holds it.
    row = f"[data-testid=share-links] tr:has-text('{link['prefix']}')"
    page.click(f"{row} >> button:has-text('revoke')")
    page.wait_for_selector(f"{row} >> text=revoked")
    stranger = browser.new_context()
    try:
        shared = stranger.new_page()
        shared.goto(f"{server.url}/share/{link['key']}")  # the server-side form of the link
        shared.wait_for_selector("text=this link is not valid")
    finally:
        stranger.close()


def test_a_dropped_socket_resumes_after_the_last_seq_without_duplicates(page, server):
    subscriptions: list[dict[str, Any]] = []
    routes: list[Any] = []

    def through(route: Any) -> None:  # a pass-through the test can cut
        upstream = route.connect_to_server()

        def from_page(message: str | bytes) -> None:
            subscriptions.append(json.loads(message))
            upstream.send(message)

        route.on_message(from_page)
        routes.append(route)

    login(page, server, "demo", "demo-pass")
    run_id = _launch_by_api(page, server)
    _wait_run_done(page, server, run_id)
    total = len(page.request.get(f"{server.url}/api/runs/{run_id}/events/").json()["events"])
    page.route_web_socket(re.compile(r".*/ws/.*"), through)
    page.goto(f"{server.url}/#/runs/{run_id}")
    page.wait_for_function(
        f"() => document.querySelector('[data-testid=stream-state]')?.textContent"
        f".endsWith('seq {total}')"
    )
    assert subscriptions[0] == {"type": "subscribe", "run": run_id, "after": 0}
    routes[0].close()
    deadline = time.monotonic() + 15
    while len(subscriptions) < 2 and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert subscriptions[1] == {"type": "subscribe", "run": run_id, "after": total}
    page.wait_for_selector("[data-testid=stream-state] >> text=live")
    # Nothing counted twice after the resume.
    assert page.text_content("[data-testid=finished-count]") == "256"
    assert page.text_content("[data-testid=stream-state]").endswith(f"seq {total}")


REAL = {
    "name": "e2e-real",
    "backend": "real",
    "steps": 2,
    "cluster": {"units": 4, "sysmetrics_s": 1.0},
    "scheduler": {"policy": "elastic", "drain_deadline_s": 0.0},
    "rollout": {"tasks_per_step": 1, "group_size": 2, "benchmark_tasks": 1, "max_turns": 4},
}


def test_a_small_real_run_moves_the_timeline_and_rollouts_live(page, server):
    """A real run (Ray units, torch engines, a trainer) launched from the browser's session:
    the role timeline gains lanes and rollouts finish while the page watches; its newest
    checkpoint downloads, and exports from the table as a Hugging Face directory."""
    login(page, server, "demo", "demo-pass")
    run = _api_post(page, server, "/api/runs/",
                    {"experiment": server.seed["experiment"], "name": "real", "config": REAL})  # fmt: skip
    page.goto(f"{server.url}/#/runs/{run['id']}")
    page.wait_for_function(  # the lanes appear while the run is live, not after
        "() => Number(document.querySelector('[data-testid=role-timeline]')"
        "?.getAttribute('data-units')) === 4 && "
        "document.querySelector('[data-testid=run-status]')?.textContent === 'running'",
        timeout=240_000,
    )
    page.wait_for_function(
        "() => ['succeeded','failed','cancelled'].includes("
        "document.querySelector('[data-testid=run-status]')?.textContent)",
        timeout=600_000,
    )
    assert page.text_content("[data-testid=run-status]") == "succeeded"
    assert int(page.text_content("[data-testid=finished-count]") or 0) >= 4
    # its checkpoints are listed with their step, and one downloads as a tar
    page.wait_for_selector("[data-testid=checkpoints] >> text=download")
    href = page.get_attribute("[data-testid=checkpoints] a:has-text('download')", "href")
    got = page.request.get(server.url + str(href))
    assert got.ok and got.headers["content-type"] == "application/x-tar" and len(got.body()) > 0
    # each unit's system metrics, stored by the worker and charted under the timeline
    url = f"{server.url}/api/runs/{run['id']}/events/?kind=sys_metrics"
    stored = [e["data"] for e in page.request.get(url).json()["events"]]
    assert {d["unit"] for d in stored} == {0, 1, 2, 3}
    assert all(d["cpu_pct"] >= 0 and d["rss_mb"] > 0 for d in stored)
    view = page.wait_for_selector("[data-testid=sys-metrics][data-units='4']")
    assert view.get_attribute("data-metrics").startswith("cpu_pct,rss_mb")
    for title in ("CPU % (100 = one core)", "memory (RSS, MB)"):
        assert page.locator(f"[data-testid='chart-{title}'] canvas").count() == 1
    # exported as a Hugging Face directory from the table (a worker runs `gyre export`)
    page.locator("[data-testid=checkpoints] button:has-text('export')").last.click()
    link = page.locator("[data-testid=checkpoints] a:has-text('download HF directory')")
    link.wait_for(timeout=300_000)
    got = page.request.get(server.url + str(link.get_attribute("href")))
    assert got.ok and got.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(got.body())) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"config.json", "model.safetensors"} <= names, names
    shot(page, "run-real")
    section = page.locator("section", has=page.locator("[data-testid=sys-metrics]"))
    section.screenshot(path=str(SHOTS / "sysmetrics.png"))


def test_team_page_registers_a_webhook_that_a_finished_run_calls(page, server):
    receiver = Receiver([])
    try:
        login(page, server, "demo", "demo-pass")
        page.goto(server.url + "/#/team")
        page.fill("input[placeholder='webhook URL']", receiver.url)
        page.click("button:has-text('add webhook')")
        row = f"[data-testid=webhooks] tr:has-text('{receiver.url}')"
        page.wait_for_selector(f"{row} >> text=failed, succeeded")
        run_id = _launch_by_api(page, server)
        deadline = time.monotonic() + 120  # the run ends, then a watchdog tick delivers
        while not page.query_selector(f"{row} >> text=run {run_id} succeeded: delivered"):
            assert time.monotonic() < deadline, "no delivery shown"
            page.click("button:has-text('refresh deliveries')")
            page.wait_for_timeout(1000)
        ours = [p for p in receiver.posts if p["run"]["id"] == run_id]
        assert len(ours) == 1 and "succeeded" in ours[0]["text"]
        shot(page, "alerts")
        page.click(f"{row} >> button:has-text('remove')")
        page.wait_for_selector(row, state="detached")
    finally:
        receiver.server.shutdown()
