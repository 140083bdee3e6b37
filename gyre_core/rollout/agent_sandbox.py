"""Where an agent command runs: the environment it gets and the sandbox around it.

An agent command's environment is built from an explicit list, never inherited: the
session (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), the task (``GYRE_MODEL``,
``GYRE_TASK_ID``, ``GYRE_TASK_PROMPT``, ``GYRE_TASK_DIR``, ``GYRE_SEED``), ``HOME`` (its own
folder), ``TMPDIR`` (in it), ``PWD``, ``PATH`` (the run's interpreter's folder, then the
system's) and ``LANG``, plus the variables the operator names in ``GYRE_AGENT_ENV``
(``"NAME1,NAME2"``), taken from the worker's environment where set.

Each rollout's command gets a folder of its own, created fresh and removed when it ends,
and starts in the directory the run started in. With ``GYRE_AGENT_SANDBOX=bwrap`` (the
default) it runs under bubblewrap (``bwrap``):

* its own user namespace (uid and gid 65534 inside, no capabilities), pid namespace (its
  ``/proc`` lists its own processes only), IPC and UTS namespaces, dying with its parent;
* a mount namespace whose root is read-only and holds only: ``/usr`` (and its ``/bin``,
  ``/lib`` links), a few files of ``/etc`` (name resolution, certificates, users), the
  run's interpreter (``sys.prefix``, ``sys.base_prefix``), the files its command line
  names below the directory the run started in (see :func:`_named_paths`), a private
  ``/tmp``, a minimal ``/dev``, its own ``/proc``; writable: its own folder and the
  task's folder (``GYRE_TASK_DIR``). Not the runs' folders, the data directory, other
  rollouts' folders, nor ``/etc``'s other files;
* a network namespace of its own with only its own loopback: its session's base URL
  reaches the endpoint through a bridge (:mod:`~gyre_core.rollout.agent_bridge`), and
  nothing else of the host's network or any other host is reachable.

``GYRE_AGENT_SANDBOX=none`` runs the command unconfined (the environment is still the
list above), for a user of ``gyre run`` on their own machine who chooses it; the platform
refuses it. A missing or unusable ``bwrap`` fails the run at its start, saying so.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gyre_core.rollout.agent_bridge import FORWARDER, SOCKET_NAME

SANDBOXES = ("bwrap", "none")
SANDBOX_VAR, ENV_VAR = "GYRE_AGENT_SANDBOX", "GYRE_AGENT_ENV"
ETC_FILES = ("hosts", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf", "passwd",
             "group", "localtime", "ssl", "ca-certificates", "alternatives", "ld.so.cache",
             "ld.so.conf", "ld.so.conf.d", "mime.types")  # fmt: skip
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SandboxError(RuntimeError):
    """The agent sandbox cannot be used as configured (the message says why)."""


def sandbox_setting(environ: Mapping[str, str] = os.environ) -> str:
    """``GYRE_AGENT_SANDBOX``: ``bwrap`` (the default) or ``none``."""
    value = environ.get(SANDBOX_VAR, "").strip().lower() or "bwrap"
    if value not in SANDBOXES:
        raise SandboxError(f"{SANDBOX_VAR}={value!r}: must be one of {', '.join(SANDBOXES)}")
    return value


def operator_names(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``GYRE_AGENT_ENV``: the variable names an operator passes on to agents."""
    names = tuple(n.strip() for n in environ.get(ENV_VAR, "").split(",") if n.strip())
    bad = [n for n in names if not _NAME.fullmatch(n)]
    if bad:
        raise SandboxError(f"{ENV_VAR}: not a variable name: {', '.join(map(repr, bad))}")
    return names


def agent_environment(
    session: Mapping[str, str], home: Path, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """An agent's whole environment: the defaults, the operator's variables (those set in
    ``environ``), then the session's variables and its folders, which nothing overrides."""
    env = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}", "LANG": "C.UTF-8"}
    env.update({n: environ[n] for n in operator_names(environ) if n in environ})
    env.update(session)
    env.update({"HOME": str(home), "TMPDIR": str(home / "tmp"), "PWD": os.getcwd()})
    return env


def check_bwrap() -> None:
    """Raise :class:`SandboxError` unless ``bwrap`` is installed and can start a sandbox
    here (the probe runs once a process)."""
    problem = _bwrap_problem()
    if problem:
        raise SandboxError(problem)


@functools.cache
def _bwrap_problem() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        return (
            "agent commands run under bubblewrap, and `bwrap` is not on PATH: install the "
            f"`bubblewrap` package (Debian/Ubuntu), or set {SANDBOX_VAR}=none to run agents "
            "unconfined with `gyre run` on your own machine"
        )
    probe = [*_namespaces(exe), *_system_binds(), "--unshare-net", "--", "/bin/sh", "-c", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap cannot start a sandbox here: {e}"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()[-500:]
        return (
            f"bwrap cannot start a sandbox here ({why}); it needs user namespaces "
            "(in a container: a seccomp profile that allows them)"
        )
    return ""


def _namespaces(exe: str) -> list[str]:
    return [exe, "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # fmt: skip


def _system_binds() -> list[str]:
    out = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / top
        if p.is_symlink():
            out += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            out += ["--ro-bind", str(p), str(p)]
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            out += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return out


def _named_paths(argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    """What a command line names that exists strictly below ``cwd``: each such word's path,
    and a named file's folder where that lies strictly below ``cwd`` too. Never a path with
    a hidden part (``.data``, ``.env``, ``.git``), nor one in or above ``GYRE_DATA_DIR``,
    nor one whose symbolic links lead elsewhere."""
    data = environ.get("GYRE_DATA_DIR")
    hidden = [Path(os.path.abspath(cwd / data)).resolve()] if data else []
    real_cwd = cwd.resolve()

    def below(p: Path, top: Path) -> bool:
        if p == top or not p.is_relative_to(top):
            return False
        return not any(part.startswith(".") for part in p.relative_to(top).parts)

    def allowed(p: Path) -> bool:
        real = p.resolve()
        if not below(p, cwd) or not below(real, real_cwd):
            return False
        return not any(real.is_relative_to(h) or h.is_relative_to(real) for h in hidden)

    out: list[Path] = []
    for word in argv:
        if not word or word.startswith("-"):
            continue
        p = Path(os.path.abspath(cwd / word))
        try:
            ok = p.exists() and allowed(p)
        except (OSError, ValueError, RuntimeError):  # too long for a path, a NUL, a loop
            ok = False
        if ok:
            out.append(p)
            if p.is_file() and allowed(p.parent):
                out.append(p.parent)
    return out


def bwrap_command(
    argv: Sequence[str],
    home: Path,
    task_dir: str | None,
    endpoint_port: int,
    cwd: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> list[str]:
    """``argv`` wrapped in the sandbox described in the module; it starts in ``cwd``
    (where the run started: relative paths of the command line resolve as outside), behind
    the forwarder that carries ``127.0.0.1:endpoint_port`` to the bridge's socket in
    ``home`` (:mod:`~gyre_core.rollout.agent_bridge`)."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxError(_bwrap_problem() or "bwrap is not on PATH")
    cwd = Path(os.path.abspath(cwd or Path.cwd()))
    out = [*_namespaces(exe), *_system_binds()]
    prefixes = {Path(sys.prefix), Path(sys.base_prefix)}
    for p in sorted(prefixes | set(_named_paths(argv, cwd, environ)), key=lambda q: len(q.parts)):
        out += ["--ro-bind", str(p), str(p)]
    for rw in (home, Path(task_dir) if task_dir else None):
        if rw is not None:
            out += ["--bind", str(rw), str(rw)]
    out += ["--unshare-net", "--dir", str(cwd), "--remount-ro", "/", "--chdir", str(cwd)]
    forwarder = [sys.executable, "-I", "-S", "-c", FORWARDER, str(home / SOCKET_NAME)]
    return [*out, "--", *forwarder, str(endpoint_port), *argv]


__all__ = ["SANDBOXES", "SandboxError", "agent_environment", "bwrap_command", "check_bwrap",
           "operator_names", "sandbox_setting"]  # fmt: skip
