"""Run the `gyre` command as a user does: a real subprocess, offline."""

from __future__ import annotations

import os
import subprocess
import sys


def gyre(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gyre_core.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
