"""A small sandboxed coding suite: write a function, pass hidden pytest tests.

Each episode gets its own folder.  The agent acts with :meth:`CodingEnv.write_file`,
:meth:`CodingEnv.read_file`, :meth:`CodingEnv.run_tests` (visible tests) and
:meth:`CodingEnv.submit` (hidden tests, partial credit = passed / total), or with the
same tools as text lines through :meth:`CodingEnv.step`.

What the sandbox does (and does not) contain -- read this before trusting it:

* Agent code only ever runs inside ``python -m pytest`` in a child process, in its own
  session / process group, with cwd, ``HOME`` and ``TMPDIR`` inside the episode folder and
  a minimal environment (``PATH``, ``LANG``, ``HOME``, ``TMPDIR`` and a few ``PYTHON*``
  flags; nothing inherited, so no secrets from the parent's environment).
* Wall-clock timeout: on expiry the whole process group gets ``SIGKILL``; the run scores 0.
* ``resource.setrlimit`` in ``preexec_fn``: address space (``memory_mb``), CPU seconds,
  file size and number of processes.  ``RLIMIT_NPROC`` is *not* enforced for root, so it
  only bites when the child runs unprivileged.
* Writes outside the folder: an audit hook (:pep:`578`) installed before pytest starts
  refuses opening files for writing outside the folder, removing / renaming / linking /
  chmod-ing outside it, spawning processes (``os.system``, ``subprocess``, ``exec*``,
  ``fork``) and loading ``ctypes``.  This is an in-process guard: it is *not* a security
  boundary against determined code (e.g. a C extension already importable in the
  interpreter could bypass it).
* When the parent runs as root *and* the interpreter is usable by ``nobody``, the child
  additionally drops to ``nobody`` (setgroups/setgid/setuid in ``preexec_fn``) with the
  folder chowned to it, so the kernel refuses writes outside too.  Where the interpreter
  lives somewhere ``nobody`` cannot read (e.g. under ``/root``), this layer is skipped;
  :attr:`SandboxReport.dropped_privileges` says which applied.
* Not contained: reads anywhere the child's user can read, network access (no network
  namespace), CPU/memory used by the parent, and result forgery -- the agent's code runs in
  the same process as the hidden tests, so a malicious solution could tamper with pytest's
  in-memory state.  Agent-written ``conftest.py`` / ini files are ignored for hidden tests
  (``--noconftest`` and an explicit ``-c``), and the report lives in a write-protected dir.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "TASKS",
    "CodingEnv",
    "CodingTask",
    "Observation",
    "PathError",
    "SandboxReport",
    "get_task",
]

_OUTPUT_TAIL = 4000
_FILE_SIZE_LIMIT = 32 * 1024 * 1024
_NPROC_LIMIT = 64
_RESERVED_PREFIX = ".gyre"


@dataclass(frozen=True)
class CodingTask:
    """One problem: the agent implements ``entry_point`` in ``solution.py``."""

    name: str
    prompt: str
    starter: str
    visible_tests: str
    hidden_tests: str
    module: str = "solution"

    @property
    def n_hidden(self) -> int:
        return sum(1 for line in self.hidden_tests.splitlines() if line.startswith("def test_"))


@dataclass(frozen=True)
class SandboxReport:
    """Result of one pytest run in the sandbox."""

    passed: int
    failed: int
    total: int
    timed_out: bool
    returncode: int | None
    duration_s: float
    output: str
    dropped_privileges: bool

    @property
    def progress(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass
class Observation:
    text: str
    done: bool = False
    progress: float = 0.0
    error: bool = False
    report: SandboxReport | None = field(default=None, repr=False)


class PathError(ValueError):
    """A path that is absolute, escapes the folder, or names a reserved file."""


# ---------------------------------------------------------------------------------------
# Built-in tasks
# ---------------------------------------------------------------------------------------

_IMPORT = "from solution import {fn}\n\n\n"

TASKS: dict[str, CodingTask] = {
    "fizzbuzz": CodingTask(
        name="fizzbuzz",
        prompt=(
            "Implement fizzbuzz(n: int) -> list[str] in solution.py: for i in 1..n return "
            "'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, "
            "else str(i)."
        ),
        starter='def fizzbuzz(n: int) -> list[str]:\n    """See the prompt."""\n    raise NotImplementedError\n',
        visible_tests=_IMPORT.format(fn="fizzbuzz")
        + "def test_small():\n    assert fizzbuzz(3) == ['1', '2', 'Fizz']\n",
        hidden_tests=_IMPORT.format(fn="fizzbuzz")
        + "def test_empty():\n    assert fizzbuzz(0) == []\n\n\n"
        + "def test_fizz():\n    assert fizzbuzz(6)[5] == 'Fizz'\n\n\n"
        + "def test_buzz():\n    assert fizzbuzz(10)[9] == 'Buzz'\n\n\n"
        + "def test_fizzbuzz():\n    assert fizzbuzz(15)[14] == 'FizzBuzz'\n",
    ),
    "palindrome": CodingTask(
        name="palindrome",
        prompt=(
            "Implement is_palindrome(s: str) -> bool in solution.py: True if s reads the "
            "same backwards, ignoring case and non-alphanumeric characters."
        ),
        starter='def is_palindrome(s: str) -> bool:\n    """See the prompt."""\n    raise NotImplementedError\n',
        visible_tests=_IMPORT.format(fn="is_palindrome")
        + "def test_simple():\n    assert is_palindrome('abba')\n",
        hidden_tests=_IMPORT.format(fn="is_palindrome")
        + "def test_plain():\n    assert is_palindrome('racecar')\n\n\n"
        + "def test_not():\n    assert not is_palindrome('abc')\n\n\n"
        + "def test_case():\n    assert is_palindrome('Abba')\n\n\n"
        + "def test_punct():\n    assert is_palindrome('A man, a plan, a canal: Panama!')\n",
    ),
    "word_count": CodingTask(
        name="word_count",
        prompt=(
            "Implement word_count(text: str) -> dict[str, int] in solution.py: count "
            "whitespace-separated words, lower-cased, with leading/trailing punctuation "
            "(string.punctuation) stripped; drop words that become empty."
        ),
        starter='def word_count(text: str) -> dict[str, int]:\n    """See the prompt."""\n    raise NotImplementedError\n',
        visible_tests=_IMPORT.format(fn="word_count")
        + "def test_basic():\n    assert word_count('a b a') == {'a': 2, 'b': 1}\n",
        hidden_tests=_IMPORT.format(fn="word_count")
        + "def test_empty():\n    assert word_count('') == {}\n\n\n"
        + "def test_repeat():\n    assert word_count('x x x') == {'x': 3}\n\n\n"
        + "def test_case():\n    assert word_count('Hi hi') == {'hi': 2}\n\n\n"
        + "def test_punct():\n    assert word_count('Hi, hi! -- ok.') == {'hi': 2, 'ok': 1}\n",
    ),
    "run_length": CodingTask(
        name="run_length",
        prompt=(
            "Implement rle(s: str) -> list[tuple[str, int]] in solution.py: run-length "
            "encode s, e.g. rle('aab') == [('a', 2), ('b', 1)]."
        ),
        starter='def rle(s: str) -> list[tuple[str, int]]:\n    """See the prompt."""\n    raise NotImplementedError\n',
        visible_tests=_IMPORT.format(fn="rle")
        + "def test_example():\n    assert rle('aab') == [('a', 2), ('b', 1)]\n",
        hidden_tests=_IMPORT.format(fn="rle")
        + "def test_empty():\n    assert rle('') == []\n\n\n"
        + "def test_single():\n    assert rle('z') == [('z', 1)]\n\n\n"
        + "def test_runs():\n    assert rle('aaabccdddd') == [('a', 3), ('b', 1), ('c', 2), ('d', 4)]\n\n\n"
        + "def test_alternating():\n    assert rle('abab') == [('a', 1), ('b', 1), ('a', 1), ('b', 1)]\n",
    ),
}


def get_task(name: str) -> CodingTask:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown coding task {name!r}; known: {sorted(TASKS)}") from None


# ---------------------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------------------

# Runs in the child (``python -P -B -c _GUARD <root> <protected> <report> pytest-args...``)
# before pytest is imported.  Kept free of f-strings so it can be passed verbatim.
_GUARD = r"""
import os, runpy, sys
_root = os.path.realpath(sys.argv[1])
_prot = os.path.realpath(sys.argv[2])
_report = os.path.realpath(sys.argv[3])
_W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_rp = os.path.realpath
_sep = os.sep

def _inside(p):
    if isinstance(p, int):
        return True
    try:
        p = _rp(os.fsdecode(p))
    except Exception:
        return False
    if p == _report or p in ('/dev/null',):
        return True
    if p == _prot or p.startswith(_prot + _sep):
        return False
    return p == _root or p.startswith(_root + _sep)

_PATH_EVENTS = {'os.remove', 'os.rmdir', 'os.mkdir', 'os.chmod', 'os.chown', 'os.truncate',
                'os.utime', 'os.chflags', 'os.setxattr', 'os.removexattr', 'shutil.rmtree'}
_TWO_PATH = {'os.rename', 'os.link', 'os.symlink', 'shutil.copyfile', 'shutil.move',
             'shutil.copytree'}
_DENY = {'os.system', 'os.exec', 'os.posix_spawn', 'os.spawn', 'os.fork', 'os.forkpty',
         'subprocess.Popen', 'ctypes.dlopen', 'ctypes.dlsym', 'ctypes.cdata', 'os.kill',
         'os.killpg', 'pty.spawn', 'socket.connect', 'socket.bind'}

def _hook(event, args):
    if event == 'open':
        path, mode, flags = args
        writing = (mode is not None and any(c in mode for c in 'wax+')) or bool(flags & _W)
        if writing and not _inside(path):
            raise PermissionError('sandbox: write outside the task folder: %r' % (path,))
    elif event in _PATH_EVENTS:
        if args and not _inside(args[0]):
            raise PermissionError('sandbox: %s outside the task folder' % event)
    elif event in _TWO_PATH:
        if len(args) >= 2 and not (_inside(args[0]) and _inside(args[1])):
            raise PermissionError('sandbox: %s outside the task folder' % event)
    elif event in _DENY:
        raise PermissionError('sandbox: %s is not allowed' % event)
    elif event == 'import' and args and args[0] in ('ctypes', '_ctypes'):
        raise ImportError('sandbox: ctypes is not allowed')

sys.addaudithook(_hook)
sys.argv = ['pytest'] + sys.argv[4:]
runpy.run_module('pytest', run_name='__main__', alter_sys=True)
"""


@functools.cache
def _nobody_ids() -> tuple[int, int] | None:
    """(uid, gid) of ``nobody`` if we are root and ``nobody`` can run this interpreter."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return None
    uid, gid = pw.pw_uid, pw.pw_gid

    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import pytest"],
            preexec_fn=drop,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (uid, gid) if probe.returncode == 0 else None


def _make_preexec(
    time_limit_s: float, memory_mb: int, ids: tuple[int, int] | None
) -> Callable[[], None]:
    cpu = max(1, int(time_limit_s) + 1)
    mem = memory_mb * 1024 * 1024

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT))
        resource.setrlimit(resource.RLIMIT_NPROC, (_NPROC_LIMIT, _NPROC_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if ids is not None:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])

    return preexec


def _chown_tree(root: Path, ids: tuple[int, int], skip: Path | None = None) -> None:
    os.chown(root, *ids)
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in dirnames + filenames:
            with contextlib.suppress(OSError):
                os.chown(Path(dirpath, name), *ids, follow_symlinks=False)


def _parse_junit(report: Path) -> tuple[int, int]:
    """(passed, not passed) test cases in a junit-xml file; (0, 0) if unreadable."""
    try:
        tree = ET.parse(report)
    except (OSError, ET.ParseError):
        return 0, 0
    passed = failed = 0
    for case in tree.iter("testcase"):
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            failed += 1
        else:
            passed += 1
    return passed, failed


class CodingEnv:
    """One episode of a :class:`CodingTask` in its own folder."""

    def __init__(
        self,
        task: CodingTask | str,
        workdir: str | os.PathLike[str] | None = None,
        time_limit_s: float = 10,
        memory_mb: int = 512,
    ) -> None:
        self.task = get_task(task) if isinstance(task, str) else task
        self.time_limit_s = float(time_limit_s)
        self.memory_mb = int(memory_mb)
        self._owns_dir = workdir is None
        if workdir is None:
            self.root = Path(tempfile.mkdtemp(prefix="gyre-coding-")).resolve()
        else:
            self.root = Path(workdir).resolve()
            self.root.mkdir(parents=True, exist_ok=True)
        self.done = False
        self.progress = 0.0
        self.last_report: SandboxReport | None = None
        (self.root / f"{self.task.module}.py").write_text(self.task.starter)
        (self.root / "test_visible.py").write_text(self.task.visible_tests)
        (self.root / "TASK.md").write_text(self.task.prompt + "\n")

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        if self._owns_dir:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> CodingEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- paths ------------------------------------------------------------------------
    def _resolve(self, path: str) -> Path:
        if not path or "\x00" in path:
            raise PathError("empty or invalid path")
        p = Path(path)
        if p.is_absolute():
            raise PathError(f"absolute paths are not allowed: {path!r}")
        if ".." in p.parts:
            raise PathError(f"'..' is not allowed in paths: {path!r}")
        if p.parts and p.parts[0].startswith(_RESERVED_PREFIX):
            raise PathError(f"reserved path: {path!r}")
        full = (self.root / p).resolve()
        if not full.is_relative_to(self.root) or full == self.root:
            raise PathError(f"path escapes the task folder: {path!r}")
        return full

    # -- tools ------------------------------------------------------------------------
    def write_file(self, path: str, content: str) -> Observation:
        if self.done:
            return Observation("episode is over", done=True, progress=self.progress, error=True)
        try:
            full = self._resolve(path)
            full.parent.mkdir(parents=True, exist_ok=True)
            if full.is_symlink():
                raise PathError(f"refusing to write through a symlink: {path!r}")
            full.write_text(content)
        except (PathError, OSError) as e:
            return Observation(f"error: {e}", error=True)
        return Observation(f"wrote {len(content)} chars to {path}")

    def read_file(self, path: str) -> Observation:
        try:
            full = self._resolve(path)
            text = full.read_text(errors="replace")
        except (PathError, OSError) as e:
            return Observation(f"error: {e}", error=True, done=self.done)
        return Observation(text, done=self.done, progress=self.progress)

    def run_tests(self) -> Observation:
        if self.done:
            return Observation("episode is over", done=True, progress=self.progress, error=True)
        rep = self._run_pytest(self.task.visible_tests, hidden=False)
        return Observation(
            f"visible tests: {rep.passed}/{rep.total} passed"
            + (" (timed out)" if rep.timed_out else "")
            + "\n"
            + rep.output,
            report=rep,
        )

    def submit(self) -> Observation:
        if self.done:
            return Observation("already submitted", done=True, progress=self.progress)
        rep = self._run_pytest(self.task.hidden_tests, hidden=True)
        self.done = True
        self.progress = rep.progress
        self.last_report = rep
        return Observation(
            f"hidden tests: {rep.passed}/{rep.total} passed"
            + (" (timed out)" if rep.timed_out else ""),
            done=True,
            progress=rep.progress,
            report=rep,
        )

    def step(self, action: str) -> Observation:
        """Text interface: ``write_file PATH`` + newline + content, ``read_file PATH``,
        ``run_tests`` or ``submit``."""
        head, _, body = action.partition("\n")
        cmd, _, arg = head.strip().partition(" ")
        arg = arg.strip()
        if cmd == "write_file" and arg:
            return self.write_file(arg, body)
        if cmd == "read_file" and arg:
            return self.read_file(arg)
        if cmd == "run_tests":
            return self.run_tests()
        if cmd == "submit":
            return self.submit()
        return Observation(
            "error: unknown action; use 'write_file PATH\\n<content>', 'read_file PATH', "
            "'run_tests' or 'submit'",
            error=True,
            done=self.done,
        )

    # -- sandbox ----------------------------------------------------------------------
    def _run_pytest(self, tests: str, *, hidden: bool) -> SandboxReport:
        ids = _nobody_ids()
        prot = self.root / f"{_RESERVED_PREFIX}-{uuid.uuid4().hex}"
        prot.mkdir(mode=0o755)
        report = prot / "report.xml"
        log = prot / "output.log"
        home = self.root / ".home"
        tmp = self.root / ".tmp"
        home.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        total = sum(1 for line in tests.splitlines() if line.startswith("def test_"))
        args = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}", "-o", "junit_family=xunit1"]
        if hidden:
            (prot / "test_hidden.py").write_text(tests)
            (prot / "pytest.ini").write_text(f"[pytest]\npythonpath = {self.root}\n")
            args += ["--noconftest", "-c", str(prot / "pytest.ini"), "--rootdir", str(prot)]
            args.append(str(prot / "test_hidden.py"))
        else:
            args += ["--rootdir", str(self.root), "test_visible.py"]
        if ids is not None:
            _chown_tree(self.root, ids, skip=prot)
            report.touch()
            os.chown(report, *ids)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": str(tmp),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONPATH": str(self.root) if not hidden else "",
        }
        cmd = [sys.executable, "-P", "-B", "-c", _GUARD, str(self.root), str(prot), str(report)]
        start = time.monotonic()
        timed_out = False
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd + args,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_make_preexec(self.time_limit_s, self.memory_mb, ids),
            )
            try:
                rc: int | None = proc.wait(timeout=self.time_limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                rc = None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if timed_out:
                proc.wait()
        duration = time.monotonic() - start
        try:
            with open(log, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - _OUTPUT_TAIL))
                output = fh.read().decode(errors="replace")
        except OSError:
            output = ""
        passed, failed = (0, 0) if timed_out else _parse_junit(report)
        total = max(total, passed + failed)
        shutil.rmtree(prot, ignore_errors=True)
        if timed_out:
            output += f"\n[sandbox] killed after {self.time_limit_s:g}s wall-clock limit"
        return SandboxReport(
            passed=passed,
            failed=total - passed,
            total=total,
            timed_out=timed_out,
            returncode=rc,
            duration_s=duration,
            output=output,
            dropped_privileges=ids is not None,
        )
