"""The platform's ASGI app served by a real daphne process on the test database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(port: int, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """daphne on ``port``, serving the test database; returns once it accepts."""
    db = connection.settings_dict
    env = {**os.environ, **(extra_env or {})}
    env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'platform'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "gyre_web.asgi:application"],
        cwd=ROOT, env=env, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "daphne did not start"
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
