"""Failed sign-ins lock a username (and a client address) for a while, on every login
path: DRF's /api/auth/login/ (which the dashboard posts to) and the admin's login. The
counts are rows in the database, so every process shares them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from gyre_web.teams.models import LoginFailures

pytestmark = pytest.mark.django_db
PATHS = ("/api/auth/login/", "/admin/login/")


@pytest.fixture
def limits(settings):
    settings.GYRE_LOGIN_MAX_FAILURES = 3
    settings.GYRE_LOGIN_MAX_FAILURES_PER_IP = 5
    settings.GYRE_LOGIN_WINDOW_SECONDS = 60.0
    settings.GYRE_LOGIN_LOCK_SECONDS = 1.0
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    user = get_user_model().objects.create_user("ada", password="right-horse", is_staff=True)
    get_user_model().objects.create_user("bob", password="bob-horse")
    return user


def _login(client: Client, username: str, password: str, path: str = PATHS[0]) -> Any:
    resp = client.post(path, {"username": username, "password": password})
    return resp


def test_failures_lock_the_username_even_for_the_right_password(limits):
    client = Client()
    for _ in range(3):
        assert _login(client, "ada", "wrong").status_code == 200  # the form, re-shown
    for path in PATHS:
        resp = _login(client, "ada", "right-horse", path)
        assert resp.status_code == 429, path
        body = resp.json()
        assert "username" in body and body["retry_after"] == 1
        assert resp["Retry-After"] == "1" and resp["Content-Type"] == "application/json"
    assert "_auth_user_id" not in client.session  # not signed in
    assert _login(Client(), "bob", "bob-horse").status_code == 302  # others still sign in
    time.sleep(1.05)  # the lock period passes
    assert _login(client, "ada", "right-horse").status_code == 302
    assert client.get("/api/teams/").status_code == 200


def test_success_resets_the_count(limits):
    client = Client()
    for _ in range(2):
        _login(client, "ada", "wrong")
    assert _login(client, "ada", "right-horse").status_code == 302
    assert not LoginFailures.objects.filter(key="user:ada").exists()
    for _ in range(2):
        assert _login(Client(), "ada", "wrong").status_code == 200
    assert _login(Client(), "ada", "right-horse").status_code == 302  # 2 + 2 is not 3


def test_one_address_trying_many_usernames_is_locked(limits):
    client = Client(REMOTE_ADDR="10.0.0.9")
    for name in ("u1", "u2", "u3", "u4", "u5"):
        assert _login(client, name, "guess").status_code == 200
    assert _login(client, "bob", "bob-horse").status_code == 429
    assert _login(Client(REMOTE_ADDR="10.0.0.10"), "bob", "bob-horse").status_code == 302
    assert LoginFailures.objects.filter(key="ip:10.0.0.9", locked_until__isnull=False).exists()
