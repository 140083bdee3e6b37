"""Deployed behind a TLS-terminating proxy (tls_proxy.py, as an ingress is) with the
production settings of docs/platform.md ("Deploying behind TLS"): signing in and a
dashboard write (a session POST with its CSRF token and ``Origin: https://host``) work,
cookies are Secure, HSTS and the Content-Security-Policy are sent, plain HTTP is redirected
(the probes' paths excepted); and ``check --deploy`` is clean with that environment."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from gyre_web.teams import services as teams

from tests.platform import daphne
from tests.platform.tls_proxy import TlsProxy, self_signed

ROOT = Path(__file__).resolve().parents[2]
HOST = "gyre.test"
PRODUCTION = {  # what deploy/ sets (besides DATABASE_URL, REDIS_URL, GYRE_SECRET_KEY)
    "GYRE_HTTPS": "1",
    "GYRE_TRUST_X_FORWARDED_PROTO": "1",
    "GYRE_HSTS_PRELOAD": "0",
    "GYRE_ALLOWED_HOSTS": f"{HOST},localhost,127.0.0.1",
}


class Browser:
    """Cookies kept across requests, each one on a new HTTPS connection to the proxy."""

    def __init__(self, port: int, cert: Path) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(cert))
        self.context.check_hostname = False  # the proxy listens on 127.0.0.1, named HOST
        self.cookies: dict[str, str] = {}
        self.secure: dict[str, bool] = {}

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[http.client.HTTPResponse, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context)
        sent = {"Host": HOST, **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        data = resp.read()
        for raw in resp.headers.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(raw).items():
                self.cookies[name] = morsel.value
                self.secure[name] = bool(morsel["secure"])
        conn.close()
        return resp, data

    def upgrade(self, path: str, signed_in: bool = True) -> bytes:
        """The status line and headers answering a websocket handshake (wss://HOST/path)."""
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        with self.context.wrap_socket(raw, server_hostname=HOST) as tls:
            cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items() if signed_in)
            tls.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                f"Sec-WebSocket-Version: 13\r\nOrigin: https://{HOST}\r\n"
                f"Cookie: {cookie}\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head and (chunk := tls.recv(4096)):
                head += chunk
        return head

    def post(self, path: str, body: bytes, content_type: str) -> tuple[Any, bytes]:
        return self.request("POST", path, body, {
            "Content-Type": content_type, "X-CSRFToken": self.cookies.get("csrftoken", ""),
            "Origin": f"https://{HOST}", "Referer": f"https://{HOST}/",
        })  # fmt: skip


@pytest.fixture
def behind_tls(tmp_path):
    cert, key = self_signed(tmp_path, HOST)
    port = daphne.free_port()
    server = daphne.start(port, PRODUCTION)
    proxy = TlsProxy(cert, key, port)
    try:
        yield Browser(proxy.port, cert), port
    finally:
        proxy.close()
        daphne.stop(server)


@pytest.mark.django_db(transaction=True)
def test_sign_in_and_a_dashboard_write_work_behind_a_tls_proxy(behind_tls):
    browser, plain_port = behind_tls
    user = get_user_model().objects.create_user("ada", password="right-horse-battery")
    team = teams.create_team(name="Lab", owner=user)

    page, _ = browser.request("GET", "/api/auth/login/")
    assert page.status == 200
    form = urlencode({"username": "ada", "password": "right-horse-battery", "next": "/",
                      "csrfmiddlewaretoken": browser.cookies["csrftoken"]})  # fmt: skip
    signed, body = browser.post(
        "/api/auth/login/", form.encode(), "application/x-www-form-urlencoded"
    )
    assert signed.status == 302, body[:300]
    assert browser.secure["sessionid"] and browser.secure["csrftoken"]
    _, body = browser.request("GET", "/api/auth/session/")
    assert json.loads(body)["username"] == "ada"

    wrote, body = browser.post(
        "/api/experiments/", json.dumps({"team": team.pk, "name": "tls"}).encode(),
        "application/json",
    )  # fmt: skip
    assert wrote.status == 201, body[:300]
    assert page.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert "connect-src 'self' wss://gyre.test;" in page.headers["Content-Security-Policy"]

    # The dashboard's live views: a websocket upgrade through the proxy with the session.
    assert browser.upgrade("/ws/").startswith(b"HTTP/1.1 101")
    assert not browser.upgrade("/ws/", signed_in=False).startswith(b"HTTP/1.1 101")

    # Straight to the server, without the proxy: redirected to https, but not the probes.
    conn = http.client.HTTPConnection("127.0.0.1", plain_port)
    conn.request("GET", "/api/runs/", headers={"Host": HOST})
    moved = conn.getresponse()
    assert moved.status == 301 and moved.headers["Location"] == f"https://{HOST}/api/runs/"
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", plain_port)
    conn.request("GET", "/healthz", headers={"Host": "localhost"})
    assert conn.getresponse().status == 200
    conn.close()


def _check_deploy(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_HSTS")}
    env.update(PRODUCTION, **extra, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'platform'}")
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_check_deploy_is_clean_with_the_production_environment():
    done = _check_deploy({})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no issues" in done.stdout
    # Left unset rather than turned off, a secure default is warned about.
    done = _check_deploy({"GYRE_HTTPS": "0"})
    assert done.returncode != 0
    for code in ("W004", "W008", "W012", "W016"):
        assert code in done.stderr


def test_a_bad_value_fails_fast_naming_the_variable():
    done = _check_deploy({"GYRE_CSRF_TRUSTED_ORIGINS": "gyre.example.com"})
    assert done.returncode != 0 and "GYRE_CSRF_TRUSTED_ORIGINS" in done.stderr
