"""Serves the built dashboard (``frontend/dist``): its hashed assets under ``/assets/`` and
``index.html`` for every other non-API path (the app routes on the client)."""

from __future__ import annotations

from pathlib import Path

from django.http import FileResponse, HttpRequest, HttpResponse
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.static import serve

DIST = Path(__file__).resolve().parents[2] / "frontend" / "dist"

MISSING = """<!doctype html><title>Gyre</title>
<h1>Gyre</h1><p>The dashboard is not built. Run <code>make setup</code> (or
<code>cd frontend &amp;&amp; npm ci &amp;&amp; npm run build</code>), then reload.
The API is at <a href="/api/">/api/</a>.</p>"""


@ensure_csrf_cookie  # the app posts forms (login, launch) with Django's CSRF token
def index(request: HttpRequest, path: str = "") -> HttpResponse:
    page = DIST / "index.html"
    if not page.exists():
        return HttpResponse(MISSING, status=503)
    return FileResponse(page.open("rb"), content_type="text/html")


def asset(request: HttpRequest, path: str) -> HttpResponse:
    return serve(request, path, document_root=str(DIST / "assets"))
