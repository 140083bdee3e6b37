"""Repository invariants that DESIGN.md asks us to keep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_platform_folder_never_shadows_the_stdlib_module():
    assert not (ROOT / "platform" / "__init__.py").exists()
    # Run from the repository root, where the folder `platform/` is first on sys.path.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import platform, sysconfig; print(platform.__file__); print(platform.system())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert Path(out[0]).parent == Path(__import__("sysconfig").get_paths()["stdlib"])
    assert out[1] == __import__("platform").system()


# The import contract (gyre_core never imports Django, ...) is test_boundaries.py.


@pytest.mark.slow
def test_stdlib_platform_module_still_works_inside_django(tmp_path):
    """Django set up by manage.py (which puts platform/ on sys.path) keeps the stdlib module."""
    code = "import platform; print(platform.__file__); print(platform.system())"
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}  # fmt: skip
    env["GYRE_DATA_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert Path(out[0]).parent == Path(__import__("sysconfig").get_paths()["stdlib"])
    assert out[1] == __import__("platform").system()
