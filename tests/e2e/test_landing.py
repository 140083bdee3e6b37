"""The signed-out landing page in real Chromium: it finds the caller signed out from
``/api/auth/session/`` (200, ``authenticated: false``) and shows the sign-in form with no
console error, no page error and no failed request; no page refuses anything under the
Content-Security-Policy (the ``page`` fixture checks it in every browser test)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow


def test_the_signed_out_landing_page_logs_no_error(page: Any, server: Server) -> None:
    errors: list[str] = []
    page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))
    page.on(
        "response",
        lambda resp: resp.status >= 400 and errors.append(f"HTTP {resp.status}: {resp.url}"),
    )
    resp = page.goto(server.url + "/")
    assert "script-src 'self';" in resp.headers["content-security-policy"]  # the page fixture
    page.wait_for_selector("input[name=username]")
    page.wait_for_load_state("networkidle")
    assert page.locator("nav >> text=Runs").count() == 0  # signed out
    assert errors == []


@pytest.mark.parametrize("path", ["/api/docs/", "/api/auth/login/", "/api/"])
def test_server_rendered_pages_pass_the_content_security_policy(
    page: Any, server: Server, path: str
) -> None:
    """Swagger UI (its own script served from a URL, not inline; the bundle comes from a
    CDN that the tests cannot reach), the browsable API and its sign-in page: the page
    fixture fails the test on any refusal."""
    resp = page.goto(server.url + path)
    assert resp.status in (200, 401, 403) and "content-security-policy" in resp.headers
    page.wait_for_load_state("load")
