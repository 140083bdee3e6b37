"""``/api/auth/session/``, the dashboard's "who am I": being signed out is an answer (200,
``authenticated: false``), so the signed-out landing page loads with no failed request;
signing in and out through the dashboard's login path changes the answer."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db
SIGNED_OUT = {"authenticated": False, "username": None, "staff": False}


def test_the_session_answers_signed_out_then_signed_in_then_out_again(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    get_user_model().objects.create_user("ada", password="right-horse", is_staff=True)
    client = Client()
    resp = client.get("/api/auth/session/")
    assert resp.status_code == 200 and resp.json() == SIGNED_OUT
    signed = client.post("/api/auth/login/", {"username": "ada", "password": "right-horse"})
    assert signed.status_code == 302
    assert client.get("/api/auth/session/").json() == {
        "authenticated": True,
        "username": "ada",
        "staff": True,
    }
    client.post("/api/auth/logout/")
    assert client.get("/api/auth/session/").json() == SIGNED_OUT


def test_refused_credentials_are_an_error_not_a_signed_out_answer():
    resp = Client().get("/api/auth/session/", HTTP_AUTHORIZATION="Token not-a-key")
    assert resp.status_code == 401
