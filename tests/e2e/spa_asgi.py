"""The platform's ASGI app with the built dashboard in front of it, for the e2e tests:
``/`` and ``/share/<key>`` answer ``frontend/dist/index.html``, ``/assets/...`` the bundles;
everything else (``/api/``, ``/ws/``, ``/admin/``) goes to Django unchanged.

Until Django serves ``frontend/dist`` itself, this is how the tests (and a developer) run
the dashboard against the real server:
    PYTHONPATH=.:platform daphne -p 8000 tests.e2e.spa_asgi:application
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from gyre_web import csp
from gyre_web.asgi import application as platform_app

DIST = Path(__file__).resolve().parents[2] / "frontend" / "dist"


def _file_for(path: str) -> Path | None:
    if path == "/" or path.startswith("/share/"):
        return DIST / "index.html"
    if path.startswith("/assets/"):
        candidate = (DIST / path.lstrip("/")).resolve()
        if candidate.is_relative_to(DIST.resolve()) and candidate.is_file():
            return candidate
    return None


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
        found = _file_for(scope["path"])
        if found is not None and found.is_file():
            body = found.read_bytes()
            kind = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            policy = csp.header(host, scope.get("scheme") == "https", scope["path"])
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", kind.encode()),
                        (b"content-length", str(len(body)).encode()),
                        (b"content-security-policy", policy.encode()),  # as Django sends
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
    await platform_app(scope, receive, send)
