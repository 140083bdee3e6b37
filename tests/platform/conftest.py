"""Django for the platform tests: service mode (Postgres + Redis) in this process; the
embedded mode (SQLite + filesystem broker) runs in subprocesses (test_embedded.py).

Set here rather than in pyproject so that the rest of the suite never sets Django up.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import django
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "platform") not in sys.path:
    sys.path.insert(0, str(ROOT / "platform"))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gyre")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/5")
os.environ.setdefault("GYRE_SECRET_KEY", "test-secret-key-" + "x" * 40)
os.environ.setdefault("GYRE_DB_CONN_MAX_AGE", "0")  # no thread keeps the test DB open
os.environ.setdefault("GYRE_DATA_DIR", tempfile.mkdtemp(prefix="gyre-test-"))
os.environ["DJANGO_SETTINGS_MODULE"] = "gyre_web.settings"
django.setup()

# A run small enough for the simulator to finish in about a second.
SIM_CONFIG: dict[str, Any] = {
    "backend": "sim",
    "steps": 2,
    "scheduler": {"policy": "elastic"},
    "sim": {"workload": "uniform", "rollouts": 32, "gpus": 16, "rollouts_per_step": 8},
}


@pytest.fixture
def sim_config() -> dict[str, Any]:
    import copy

    return copy.deepcopy(SIM_CONFIG)


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    """A team with one user per role, plus an outsider in another team."""
    from django.contrib.auth import get_user_model
    from gyre_web.teams import services

    User = get_user_model()
    users = {name: User.objects.create_user(name) for name in
             ("owner", "admin", "member", "viewer", "outsider")}  # fmt: skip
    team = services.create_team(name="Lab", owner=users["owner"])
    for role in ("admin", "member", "viewer"):
        services.set_membership(team=team, user=users[role], role=role)
    other = services.create_team(name="Elsewhere", owner=users["outsider"])
    return {**users, "team": team, "other_team": other}


@pytest.fixture
def client_for():
    from rest_framework.test import APIClient

    def make(user: Any = None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make
