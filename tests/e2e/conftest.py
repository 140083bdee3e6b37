"""A real Gyre server for the browser tests, in embedded mode: a temporary data dir
(SQLite, filesystem broker, no channel layer), migrated and seeded with a demo user, served
by daphne with the built dashboard in front (spa_asgi.py), plus a Celery worker to run the
launched runs. Chromium is Debian's (/usr/bin/chromium) driven by Playwright.

Skipped, with the reason, when the dashboard is not built (cd frontend && npm run build)
or Chromium is missing (apt-get install chromium)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST_INDEX = ROOT / "frontend" / "dist" / "index.html"
CHROMIUM = Path(os.environ.get("GYRE_CHROMIUM", "/usr/bin/chromium"))
SHOTS = ROOT / "docs" / "screenshots"


def _missing(reason: str) -> None:
    """Skip, or fail where the caller requires the browser tests (make test does)."""
    if os.environ.get("GYRE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"GYRE_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


if not DIST_INDEX.exists():
    _missing("frontend/dist/index.html is missing: build the dashboard (cd frontend && "
             "npm ci && npm run build)")  # fmt: skip
if not CHROMIUM.exists():
    _missing(f"{CHROMIUM} is missing: apt-get install chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(data_dir: Path) -> dict[str, str]:
    drop = ("DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        GYRE_DATA_DIR=str(data_dir),
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'platform'}",
        DJANGO_SETTINGS_MODULE="gyre_web.settings",
        GYRE_EVENT_POLL_SECONDS="0.2",
        GYRE_EXTERNAL_AGENTS="1",  # test_agents.py launches the example agent
        GYRE_WEBHOOK_ALLOW_NETS="127.0.0.0/8",  # the webhook test's receiver is on loopback
    )
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


class Server:
    def __init__(self, url: str, seed: dict[str, Any], env: dict[str, str]) -> None:
        self.url, self.seed, self.env = url, seed, env


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("gyre-e2e")
    env = _env(data)
    _manage(env, "migrate", "-v", "0")
    code = (ROOT / "tests" / "e2e" / "seed.py").read_text()
    seed = json.loads(_manage(env, "shell", "--no-imports", "-c", code).strip().splitlines()[-1])
    port = _free_port()
    logs = data / "logs"
    logs.mkdir()
    with ExitStack() as stack:
        web_log = stack.enter_context(open(logs / "web.log", "wb"))
        worker_log = stack.enter_context(open(logs / "worker.log", "wb"))
        web = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "tests.e2e.spa_asgi:application"],
            cwd=ROOT, env=env, stdout=web_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        stack.callback(_stop, web)
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-P", "solo",
             "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"],
            cwd=ROOT, env=env, stdout=worker_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        stack.callback(_stop, worker)
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/", web)
        yield Server(url, seed, env)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page whose test fails if the Content-Security-Policy refused anything on it
    (Chromium logs each refusal to the console: "... violates the following Content
    Security Policy directive ...")."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.set_default_timeout(20_000)
    refused: list[str] = []
    p.on(
        "console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None
    )
    yield p
    context.close()
    assert not refused, f"the Content-Security-Policy refused: {refused}"


def login(page: Any, server: Server, username: str, password: str) -> None:
    page.goto(server.url + "/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("nav >> text=Runs")


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
