"""Scripted agents against the sandboxed coding suite."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gyre_core.envs.coding import TASKS, CodingEnv

FIZZ_OK = (
    "def fizzbuzz(n):\n"
    "    return [('Fizz' * (i % 3 == 0) + 'Buzz' * (i % 5 == 0)) or str(i)"
    " for i in range(1, n + 1)]\n"
)
# Handles Fizz but not Buzz: passes test_empty and test_fizz, fails test_buzz/test_fizzbuzz.
FIZZ_HALF = (
    "def fizzbuzz(n):\n    return ['Fizz' if i % 3 == 0 else str(i) for i in range(1, n + 1)]\n"
)
SOLUTIONS = {
    "fizzbuzz": FIZZ_OK,
    "palindrome": (
        "def is_palindrome(s):\n"
        "    t = [c.lower() for c in s if c.isalnum()]\n"
        "    return t == t[::-1]\n"
    ),
    "word_count": (
        "import string\n\n"
        "def word_count(text):\n"
        "    out = {}\n"
        "    for w in text.split():\n"
        "        w = w.strip(string.punctuation).lower()\n"
        "        if w:\n"
        "            out[w] = out.get(w, 0) + 1\n"
        "    return out\n"
    ),
    "run_length": (
        "import itertools\n\n"
        "def rle(s):\n"
        "    return [(k, len(list(g))) for k, g in itertools.groupby(s)]\n"
    ),
}


def test_every_task_has_a_solution() -> None:
    assert set(SOLUTIONS) == set(TASKS)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_correct_solution_scores_one(name: str) -> None:
    with CodingEnv(name) as env:
        assert not env.write_file("solution.py", SOLUTIONS[name]).error
        vis = env.run_tests()
        assert vis.report is not None and vis.report.passed == vis.report.total == 1
        obs = env.submit()
        assert obs.done and obs.progress == 1.0
        assert env.submit().progress == 1.0  # idempotent after the episode ends


def test_partial_solution_gets_partial_credit() -> None:
    with CodingEnv("fizzbuzz") as env:
        env.write_file("solution.py", FIZZ_HALF)
        obs = env.submit()
        assert obs.progress == pytest.approx(0.5)
        assert obs.report is not None and (obs.report.passed, obs.report.total) == (2, 4)


def test_starter_and_hidden_tests_not_visible() -> None:
    with CodingEnv("palindrome") as env:
        assert "NotImplementedError" in env.read_file("solution.py").text
        assert "racecar" not in "".join(p.read_text() for p in env.root.rglob("*.py"))
        assert env.submit().progress == 0.0


def test_text_interface() -> None:
    with CodingEnv("run_length") as env:
        assert not env.step("write_file solution.py\n" + SOLUTIONS["run_length"]).error
        assert "rle" in env.step("read_file solution.py").text
        assert env.step("bogus").error
        assert env.step("submit").progress == 1.0


@pytest.mark.parametrize("path", ["/tmp/x.py", "../x.py", "a/../../x.py", ".gyre-x/t.py", ""])
def test_paths_confined(path: str, tmp_path: Path) -> None:
    work = tmp_path / "w"
    with CodingEnv("fizzbuzz", workdir=work) as env:
        assert env.write_file(path, "x").error
        assert env.read_file(path).error if path else True
    assert not (tmp_path / "x.py").exists()
    assert work.exists()  # caller-owned workdir is kept


def test_symlink_escape_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with CodingEnv("fizzbuzz") as env:
        (env.root / "link").symlink_to(outside)
        assert env.write_file("link/evil.py", "x").error
    assert not (outside / "evil.py").exists()


def test_infinite_loop_killed_and_scored_zero() -> None:
    with CodingEnv("fizzbuzz", time_limit_s=2) as env:
        env.write_file("solution.py", "def fizzbuzz(n):\n    while True:\n        pass\n")
        obs = env.submit()
        assert obs.done and obs.progress == 0.0
        assert obs.report is not None and obs.report.timed_out
        assert obs.report.duration_s < 5


def test_write_outside_folder_contained() -> None:
    target = Path("/tmp") / f"gyre-escape-{uuid.uuid4().hex}"
    code = (
        "import os, subprocess\n"
        f"P = {str(target)!r}\n"
        "for attempt in (\n"
        "    lambda: open(P, 'w').write('x'),\n"
        "    lambda: os.close(os.open(P, os.O_CREAT | os.O_WRONLY)),\n"
        "    lambda: os.system('touch ' + P),\n"
        "    lambda: subprocess.run(['touch', P]),\n"
        "    lambda: os.symlink(P, 'ln'),\n"
        "):\n"
        "    try:\n"
        "        attempt()\n"
        "    except Exception:\n"
        "        pass\n"
        "try:\n"
        "    with open('ln', 'w') as f:\n"
        "        f.write('x')\n"
        "except Exception:\n"
        "    pass\n" + FIZZ_OK
    )
    try:
        with CodingEnv("fizzbuzz") as env:
            env.write_file("solution.py", code)
            obs = env.submit()
            assert obs.progress == 1.0  # still scored normally
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_inside_writes_allowed() -> None:
    code = "open('scratch.txt', 'w').write('ok')\n" + FIZZ_OK
    with CodingEnv("fizzbuzz") as env:
        env.write_file("solution.py", code)
        assert env.submit().progress == 1.0
        assert (env.root / "scratch.txt").read_text() == "ok"


def test_memory_hog_contained() -> None:
    code = (
        "def fizzbuzz(n):\n"
        "    if n == 0:\n"
        "        return []\n"
        "    x = bytearray(4 * 1024 ** 3)\n"
        "    return [str(len(x))]\n"
    )
    with CodingEnv("fizzbuzz", memory_mb=512) as env:
        env.write_file("solution.py", code)
        obs = env.submit()
        assert obs.done and obs.progress == 0.25  # only test_empty passes
        assert obs.report is not None and not obs.report.timed_out
        assert "MemoryError" in obs.report.output


def test_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_SECRET_TOKEN", "hunter2")
    code = (
        "import os\n"
        "assert 'GYRE_SECRET_TOKEN' not in os.environ\n"
        "assert os.environ['HOME'].startswith(os.getcwd())\n" + FIZZ_OK
    )
    with CodingEnv("fizzbuzz") as env:
        env.write_file("solution.py", code)
        assert env.submit().progress == 1.0


def test_agent_conftest_ignored_for_hidden_tests() -> None:
    conftest = (
        "import pytest\n\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    out = yield\n"
        "    out.get_result().outcome = 'passed'\n"
    )
    with CodingEnv("fizzbuzz") as env:
        env.write_file("conftest.py", conftest)
        assert env.submit().progress == 0.0


def test_tempdir_removed_on_close() -> None:
    env = CodingEnv("fizzbuzz")
    root = env.root
    env.close()
    assert not root.exists()
