"""Content-Security-Policy on every response (``GYRE_CSP_REPORT_ONLY=1`` sends it as
``Content-Security-Policy-Report-Only`` instead, to try a change without breaking pages).

The dashboard (``frontend/dist``) loads only its own scripts and stylesheets, sets styles
through the DOM (which a policy does not govern), draws charts on canvas and opens its
websocket to the host it came from: everything is ``'self'``, plus ``ws:``/``wss:`` to the
same host (older browsers do not count a websocket to the same host as ``'self'``). The API
docs page (``/api/docs/``, Swagger UI) loads its bundle from jsDelivr and has one inline
``<style>``; only that page's policy allows those. The pages Django renders (the
browsable API, the admin) have inline styles, allowed there; their scripts are files."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

CDN = "https://cdn.jsdelivr.net"
DOCS_PREFIX = "/api/docs/"
SERVER_PAGES = ("/api/", "/admin/")  # pages rendered by Django: browsable API, admin


def policy(request: HttpRequest) -> str:
    return header(request.get_host(), request.is_secure(), request.path)


def header(host: str, secure: bool, path: str) -> str:
    """The policy for a page at ``path`` served from ``host`` (over https if ``secure``)."""
    docs = path.startswith(DOCS_PREFIX)
    # Pages Django renders have style="..." attributes and <style> (the browsable API's
    # code highlighting); the dashboard has neither.
    style = "'self' 'unsafe-inline'" if path.startswith(SERVER_PAGES) else "'self'"
    ws = "wss" if secure else "ws"
    directives = {
        "default-src": "'self'",
        "script-src": f"'self' {CDN}" if docs else "'self'",
        "style-src": f"'self' {CDN} 'unsafe-inline'" if docs else style,
        "img-src": f"'self' data: {CDN}" if docs else "'self' data:",
        "font-src": "'self'",
        "connect-src": f"'self' {ws}://{host}",
        "object-src": "'none'",
        "base-uri": "'self'",
        "form-action": "'self'",
        "frame-ancestors": "'none'",
    }
    return "; ".join(f"{name} {value}" for name, value in directives.items())


class CspMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        header = (
            "Content-Security-Policy-Report-Only"
            if settings.GYRE_CSP_REPORT_ONLY
            else "Content-Security-Policy"
        )
        if header not in response:
            response[header] = policy(request)
        return response
