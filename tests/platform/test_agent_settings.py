"""The platform's agent sandbox settings: a bad value, or ``none``, stops a web or worker
process at its start (agents of the platform's runs always run under bubblewrap)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from gyre_web.settings.agents import agent_env, agent_sandbox

ROOT = Path(__file__).parents[2]


def test_the_sandbox_is_bwrap_and_none_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYRE_AGENT_SANDBOX", raising=False)
    assert agent_sandbox() == "bwrap"
    monkeypatch.setenv("GYRE_AGENT_SANDBOX", "none")
    with pytest.raises(ImproperlyConfigured, match="'none' is refused on the platform"):
        agent_sandbox()
    monkeypatch.setenv("GYRE_AGENT_SANDBOX", "docker")
    with pytest.raises(ImproperlyConfigured, match="'docker' is not one of: bwrap"):
        agent_sandbox()
    monkeypatch.setenv("GYRE_AGENT_ENV", "HF_TOKEN, MY_PROXY")
    assert agent_env() == ["HF_TOKEN", "MY_PROXY"]
    monkeypatch.setenv("GYRE_AGENT_ENV", "HF_TOKEN,bad name")
    with pytest.raises(ImproperlyConfigured, match="not a variable name: bad name"):
        agent_env()


def test_a_process_with_an_unconfined_sandbox_does_not_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(GYRE_DATA_DIR=str(tmp_path), GYRE_AGENT_SANDBOX="none",
               DJANGO_SETTINGS_MODULE="gyre_web.settings")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "GYRE_AGENT_SANDBOX='none' is refused on the platform" in done.stderr
