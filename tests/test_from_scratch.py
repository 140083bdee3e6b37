"""The README's main-job command on a fresh clone, in embedded mode (no DATABASE_URL, no
REDIS_URL): the server answers, the demo run starts and streams events, all shut down."""

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SMALL = """\
name: scratch
steps: 2
cluster: {units: 4}
scheduler: {drain_deadline_s: 0.0}
rollout: {tasks_per_step: 1, group_size: 2, benchmark_tasks: 1, max_turns: 4}
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_make_demo_on_a_fresh_clone_serves_and_runs_the_demo(tmp_path) -> None:
    clone = tmp_path / "gyre"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (tmp_path / "small.yaml").write_text(SMALL)
    port = _port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "DJANGO_SETTINGS_MODULE")
    }
    env["GYRE_DATA_DIR"] = str(tmp_path / "data")
    # The clone shares this checkout's venv (the suite has just built it); everything else
    # (dashboard build, database, secret, broker) is made from nothing by `make demo`.
    args = f"--exit-when-done --port {port} --config {tmp_path / 'small.yaml'}"
    venv = Path(sys.executable).parent.parent
    answers: list[int] = []

    def probe() -> None:
        while not answers:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    answers.append(r.status)
            except OSError:
                time.sleep(0.5)

    threading.Thread(target=probe, daemon=True).start()
    out = subprocess.run(["make", "demo", f"VENV={venv}", f"DEMO_ARGS={args}"], cwd=clone,
                         env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert answers == [200]
    text = out.stdout
    assert "Gyre is up (embedded mode)" in text and "Log in as demo / demo" in text
    assert "step 1:" in text and "step 2:" in text and "status succeeded" in text
    assert (tmp_path / "data" / "db.sqlite3").exists() or list(
        (tmp_path / "data").glob("*.sqlite3")
    )
    # Clean shutdown: nothing of the demo listens any more.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
