"""One unit's process in a run's streaming training world (``scheduler.streaming``).

Where :class:`~gyre_core.train.member.TrainMember` re-forms an FSDP group whenever the
training units change, a streaming run forms one world over **every** unit of the run,
once, at its start (one process per unit, rank = the unit's place in the run), with the
process groups of every prefix of ranks made then (:func:`~gyre_core.train.streaming.
prefix_groups`): no group is made or destroyed when a unit switches role. Rank 0 is the
*core* (the authoritative weights and the only AdamW state), the others *satellites*
(weights only). Each step runs as :class:`~gyre_core.train.streaming.StreamStep` says:
the core leads it, the satellites in the train role serve it, and a unit that enters
training while it runs joins it in progress.

A unit that leaves training is *parked*: the core's AdamW state goes to host memory
(pinned on a GPU) and its model with it where it trains on a GPU; a satellite's weights
leave the device (it pulls the next step's snapshot when it joins again). A unit that
enters training is *unparked*: the state comes back to the training device, bit for bit.
Each reports the seconds it took (``offload_s``, ``restore_s``).

Checkpoints, warm-start steps, full-weight files and the weights sent to the engines are
the core's alone (a satellite holds nothing a checkpoint needs): it writes the same
sharded checkpoint format as a training group, whole, with no collective.

No Ray here: the driver (:mod:`gyre_core.runtime.stream_group`) calls these methods on
each unit's actor; a test spawns processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch._C._distributed_c10d import PrefixStore, TCPStore
from transformers import AutoModelForCausalLM

from gyre_core.train.config import TrainSetup
from gyre_core.train.group_abort import collective_timeout, set_timeout
from gyre_core.train.member import CHECKPOINT, TIMEOUT, GroupSpec, device_and_backend
from gyre_core.train.sharded_checkpoint import load_state, save_state
from gyre_core.train.streaming import (
    CORE,
    StreamStep,
    offload_optimizer,
    prefix_groups,
    restore_optimizer,
)
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.sample import PackedSample


class StreamMember:
    """The streaming side of one unit's process (see the module docstring); the same
    constructor as :class:`~gyre_core.train.member.TrainMember`."""

    def __init__(self, setup: TrainSetup, model_dir: str, reference: str = "") -> None:
        self.setup, self.model_dir, self.reference = setup, model_dir, reference
        self.device, self.backend = device_and_backend()
        self.trainer: Trainer | None = None
        self.stream: StreamStep | None = None
        self.host: dict[int, dict[str, Any]] | None = None  # the core's parked AdamW state
        self.parked = True
        self.rank = -1
        self.store: Any = None

    @property
    def formed(self) -> bool:
        return self.trainer is not None

    @property
    def core(self) -> bool:
        return self.rank == CORE

    @property
    def model(self) -> Any:
        return self._trainer().model

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError("this process is not in a streaming world")
        return self.trainer

    # ------------------------------------------------------------------ the world

    def form(self, spec: GroupSpec, store: TCPStore | None = None) -> dict[str, float]:
        """Join the run's streaming world (every unit at once, ``spec.units`` of them, one
        process each; the first passes the rendezvous ``store`` it opened). Every process
        builds the model from the model folder (or the weights file ``spec.path``); the core
        reads a checkpoint where ``spec.source`` is one. The process starts parked."""
        if not spec.stream:
            raise ValueError("a streaming world needs GroupSpec.stream (its snapshot folder)")
        t0 = time.perf_counter()
        self.leave()
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray shows each process its own GPU as device 0
        if store is None:
            store = TCPStore(spec.address, spec.port, spec.units, False, TIMEOUT)
        self.store, self.rank = store, spec.rank
        dist.init_process_group(
            self.backend,
            store=PrefixStore(spec.key, store),
            rank=spec.rank,
            world_size=spec.units,
            timeout=TIMEOUT,
        )
        groups = prefix_groups(spec.units)
        mine = [g for k, g in groups.items() if spec.rank < k]  # the others: non-members
        set_timeout([None, *mine], collective_timeout())
        ref = self._load(self.reference) if self.setup.train.kl_coef > 0 else None
        trainer = Trainer.for_run(self._load(), self.setup, ref)
        trainer.version = spec.version
        t1 = time.perf_counter()
        if spec.source == CHECKPOINT and self.core:
            load_state(trainer, Path(spec.path), strict=spec.strict, alone=True)
            trainer.version = spec.version
        elif spec.source != CHECKPOINT and spec.path:
            trainer.model.load_state_dict(load_file(spec.path))
        self.trainer = trainer
        claims = PrefixStore(f"{spec.key}stream/", store)
        Path(spec.stream).mkdir(parents=True, exist_ok=True)
        self.stream = StreamStep(trainer, claims, groups, spec.stream)
        self.parked = False
        parts = {"reform_s": t1 - t0, "restore_s": time.perf_counter() - t1}
        self.park()
        return parts

    def _load(self, path: str = "") -> Any:
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        if path:
            model.load_state_dict(load_file(path))
        return model.to(self.device)

    def leave(self, offload: str = "", version: int = 0) -> dict[str, float]:
        """Leave the world (the run ends or its units are released); ``offload``: the core
        first writes its state there as a checkpoint of ``version``."""
        t0 = time.perf_counter()
        if offload and self.trainer is not None and self.core:
            self.unpark()
            save_state(self.trainer, Path(offload), version, alone=True)
        self.trainer = self.stream = self.host = None
        if dist.is_initialized():
            dist.destroy_process_group()
        return {"offload_s": time.perf_counter() - t0 if offload else 0.0}

    def abort(self) -> int:
        """Nothing to abort: a streaming world's collectives are a step's reductions."""
        return 0

    # ------------------------------------------------------------------ roles

    def park(self) -> dict[str, float]:
        """Leave the train role: the core's AdamW state to host memory, the model off a
        GPU (on the CPU it stays where it is)."""
        t0 = time.perf_counter()
        t = self._trainer()
        if not self.parked:
            if self.core:
                self.host = offload_optimizer(t)
            if self.device == "cuda":
                model: Any = t.model
                model.to("cpu")
                torch.cuda.empty_cache()
            self.parked = True
        return {"offload_s": time.perf_counter() - t0}

    def unpark(self) -> dict[str, float]:
        """Enter the train role: the model and the core's AdamW state back on the
        training device."""
        t0 = time.perf_counter()
        t = self._trainer()
        if self.parked:
            if self.device == "cuda":
                model: Any = t.model
                model.to(self.device)
            if self.core and self.host is not None:
                restore_optimizer(t, self.host)
                self.host = None
            self.parked = False
        return {"restore_s": time.perf_counter() - t0}

    def info(self) -> dict[str, float]:
        """What this process holds: its rank, the AdamW state's entries on the device and
        on the host, whether it is parked."""
        t = self._trainer()
        return {
            "rank": float(self.rank),
            "optimizer_state": float(len(t.optimizer.state)),
            "host_state": float(len(self.host or {})),
            "parked": float(self.parked),
        }

    # ------------------------------------------------------------------ steps

    def open(self, step: int, samples: list[PackedSample], version: int) -> None:
        """The core opens step ``step`` on its first micro-steps, made at ``version``."""
        if not self.core or self.stream is None:
            raise RuntimeError(f"rank {self.rank} is not the core of a streaming world")
        self.unpark()
        self._trainer().version = version  # a skipped step moved the run on without us
        self.stream.open(step, samples)

    def feed(self, step: int, samples: list[PackedSample]) -> None:
        self._stream().feed(step, samples)

    def seal(self, step: int, total: float) -> None:
        self._stream().seal(step, total)

    def finish(self, step: int) -> dict[str, float]:
        """The core's work on step ``step`` and its update (once sealed)."""
        stream = self._stream()
        out = stream.finish(step)
        return {**out, "skipped": out.get("skipped", 0.0), "claimed": float(len(stream.claimed))}

    def _stream(self) -> StreamStep:
        if self.stream is None:
            raise RuntimeError(f"rank {self.rank} is not in a streaming world")
        return self.stream

    def serve(self, step: int) -> dict[str, float]:
        """A satellite's part in step ``step`` (joined in progress when it is late):
        ``took`` whether it joined, ``claimed`` the micro-steps it ran."""
        stream = self._stream()
        self.unpark()
        took = stream.serve(step)
        return {"took": float(took), "claimed": float(len(stream.claimed) if took else 0)}

    def sft(
        self, mine: list[PackedSample], rounds: int, targets: int, lr: float
    ) -> dict[str, float]:
        """A supervised step on the core alone (a warm start; ``rounds`` and ``targets``
        are the group's split, unused: the core takes the whole batch). The version is not
        advanced."""
        del rounds, targets
        t = self._trainer()
        self.unpark()
        version, rates = t.version, [g["lr"] for g in t.optimizer.param_groups]
        for g in t.optimizer.param_groups:
            g["lr"] = lr
        out = t.sft_step(mine)  # the whole batch: its targets are ``targets``
        for g, rate in zip(t.optimizer.param_groups, rates, strict=True):
            g["lr"] = rate
        t.version = version
        return {"sft_loss": out["sft_loss"], "grad_norm": out["grad_norm"]}

    # ------------------------------------------------------------------ the core's state

    def set_reference(self, path: str) -> None:
        """The KL reference becomes the weights of the file ``path`` (a warm start's)."""
        self.reference = path
        ref = self._trainer().ref_model
        if ref is not None:
            ref.load_state_dict(load_file(path))

    def reset_optimizer(self) -> None:
        self._trainer().optimizer.state.clear()
        self.host = None

    def load_weights(self, path: str) -> None:
        self._trainer().model.load_state_dict(load_file(path))

    def write_weights(self, path: str) -> None:
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        tmp = Path(path).with_suffix(".tmp")
        save_file(state, str(tmp))
        tmp.replace(path)

    def save(self, path: str, version: int) -> None:
        """A checkpoint of the core's state (the training group's format, written whole)."""
        parked = self.parked
        self.unpark()  # the moments are saved from where they train
        save_state(self._trainer(), Path(path), version, alone=True)
        if parked:
            self.park()

    def load(self, path: str) -> int:
        self.unpark()
        return load_state(self._trainer(), Path(path), strict=False, alone=True)
