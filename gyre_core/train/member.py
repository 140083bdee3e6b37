"""One process of a run's training group, across the groups it takes part in.

The training units of a run form one ``torch.distributed`` group (``units x per_unit``
processes, a :class:`~gyre_core.train.sharded.ShardedTrainer` on each). When units enter
or leave training the group re-forms without restarting any process, and nothing is read
from disk or copied for it: each process that stays keeps its shards, the tensors
themselves (:meth:`~gyre_core.train.sharded.ShardedTrainer.local_state`: the shard layout
depends only on the processes per unit, which never change); the group is destroyed and
made again with the new membership, and the model is built again on the meta device (its
structure, no weights) and sharded over the new mesh, adopting the kept tensors as its
shards. The processes of a unit that joins build the same way with empty shards and
receive them from a peer unit over the new group (``broadcast_from``). When the last unit
leaves, the state is written as a sharded checkpoint (the offload) and read back by the
next group, at whatever width it has (into a model built on the meta device as well); only
a group formed from the model folder reads it (``from_pretrained``). A member reports how
long each part took.

Each formation makes the process groups it uses (the default group and the mesh's two),
none ahead: under gloo a group costs milliseconds; under NCCL its communicators are made
lazily, at the group's first collective. A lost peer's collectives are aborted from
another thread (:meth:`TrainMember.abort`, :mod:`gyre_core.train.group_abort`) and time
out after ``GYRE_COLLECTIVE_TIMEOUT_S`` where no abort comes.

The driver of a run decides the membership and the batches (:mod:`gyre_core.runtime.
train_group`); this module runs in each process and needs no Ray: a test spawns processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch._C._distributed_c10d import PrefixStore, TCPStore
from transformers import AutoConfig, AutoModelForCausalLM

from gyre_core.train.config import TrainSetup
from gyre_core.train.group_abort import GroupAbort, collective_timeout, set_timeout
from gyre_core.train.sharded import LocalState, ShardedTrainer, unit_mesh
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.sample import PackedSample

KEEP, CHECKPOINT, INIT = "keep", "checkpoint", "init"  # where a new group's state comes from
TIMEOUT = timedelta(seconds=300)  # the rendezvous store's: a member may be slow to arrive


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One process's place in a group to form. ``source``: ``keep`` (processes with state
    keep it; when a unit joins, every process receives the state of unit ``replica`` of the
    new group, -1 when none joins), ``checkpoint``
    (every process reads the sharded checkpoint ``path``) or ``init`` (the model folder's
    weights, or the full weights file ``path`` when given). ``version``: the policy
    version of that state."""

    rank: int
    units: int
    per_unit: int
    address: str
    port: int
    source: str
    replica: int = -1
    path: str = ""
    version: int = 0
    strict: bool = False  # a checkpoint of other trainer settings is refused (a resume)
    key: str = ""  # this formation's own prefix in the rendezvous store
    stream: str = ""  # a streaming world's snapshot folder (train/stream_member.py); "" none

    def __post_init__(self) -> None:
        if self.source not in (KEEP, CHECKPOINT, INIT):
            raise ValueError(f"GroupSpec.source must be keep, checkpoint or init: {self.source!r}")
        if self.source == KEEP and not -1 <= self.replica < self.units:
            raise ValueError(f"GroupSpec.replica {self.replica} is not a unit of the group")


def open_store() -> TCPStore:
    """A rendezvous store listening on a port the system picks (held from the start, so no
    other group on the machine can take it); its ``port`` goes to the other members."""
    return TCPStore("0.0.0.0", 0, None, True, TIMEOUT, wait_for_workers=False)


@contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter a module registers meanwhile goes to the meta device (no memory is
    filled: its initialisation runs on meta); buffers stay real. As accelerate's
    ``init_empty_weights(include_buffers=False)``."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            meta = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            module._parameters[name] = meta

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def device_and_backend() -> tuple[str, str]:
    """CUDA with NCCL where there is a GPU, else the CPU with gloo: one code path."""
    return ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")


class TrainMember:
    """The training side of one process: ``setup`` is what the run's trainer takes of its
    config, ``model_dir`` the run's model folder, ``reference`` a full weights file for the
    KL reference ("" for the model folder's)."""

    def __init__(self, setup: TrainSetup, model_dir: str, reference: str = "") -> None:
        self.setup, self.model_dir, self.reference = setup, model_dir, reference
        self.sharded: ShardedTrainer | None = None
        self.device, self.backend = device_and_backend()
        self.aborter = GroupAbort(self.backend)

    @property
    def formed(self) -> bool:
        return self.sharded is not None

    @property
    def model(self) -> Any:
        """The model this process trains (its shards)."""
        return self._trainer().trainer.model

    def _trainer(self) -> ShardedTrainer:
        if self.sharded is None:
            raise RuntimeError("this process is not in a training group")
        return self.sharded

    def _build(
        self, mesh: Any, version: int, source: str, kept: LocalState | None
    ) -> ShardedTrainer:
        """The trainer of a new group: from the model folder's weights (``from_pretrained``)
        for a group formed from them (``source`` ``init``), else built on the meta device
        (no weights read) and given ``kept``, this process's own shards, or empty ones to
        fill. A KL reference this process did not keep is read from its file."""

        def load(path: str = "") -> Any:
            model: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            if path:
                model.load_state_dict(load_file(path))
            return model.to(self.device)

        wants_ref = self.setup.train.kl_coef > 0
        if source == INIT:
            ref = load(self.reference) if wants_ref else None
            trainer = Trainer.for_run(load(), self.setup, ref)
        else:
            keeps_ref = kept is not None and bool(kept.ref)
            ref = (self._skeleton() if keeps_ref else load(self.reference)) if wants_ref else None
            trainer = Trainer.for_run(self._skeleton(), self.setup, ref)
        trainer.version = version
        sharded = ShardedTrainer(trainer, mesh)
        if sharded.on_meta():
            sharded.set_local_state(kept)
        return sharded

    def _skeleton(self) -> Any:
        """The run's model with its parameters on the meta device (no memory, nothing read)
        and its buffers (rotary frequencies) computed on this process's device."""
        config = AutoConfig.from_pretrained(self.model_dir)
        with params_on_meta():
            model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        for module in model.modules():
            for name, buf in module._buffers.items():
                if buf is not None:
                    module._buffers[name] = buf.to(self.device)
        return model

    def form(self, spec: GroupSpec, store: TCPStore | None = None) -> dict[str, float]:
        """Join the group ``spec`` describes (every member calls this at once; the first
        passes the rendezvous ``store`` it opened, :func:`open_store`); returns the seconds
        of its parts: ``reform_s`` (group and model rebuilt around the shards kept),
        ``transfer_s`` (shards from a peer), ``restore_s`` (state read)."""
        t0 = time.perf_counter()
        kept = None
        if spec.source == KEEP and self.sharded is not None:
            kept = self.sharded.local_state()  # the tensors themselves: nothing is copied
        self._disband()
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray shows each process its own GPU as device 0
        world = spec.units * spec.per_unit
        if store is None:
            store = TCPStore(spec.address, spec.port, world, False, TIMEOUT)
        self.aborter.before()
        dist.init_process_group(
            self.backend,
            store=PrefixStore(spec.key, store),
            rank=spec.rank,
            world_size=world,
            timeout=TIMEOUT,  # the rendezvous: members may arrive far apart
        )
        mesh = unit_mesh(spec.units, spec.per_unit, self.device)
        self.aborter.after()
        groups = [None, mesh.get_group("replicate"), mesh.get_group("shard")]
        set_timeout(groups, collective_timeout())  # every collective after it
        self.sharded = self._build(mesh, spec.version, spec.source, kept)
        del kept
        parts = {"reform_s": 0.0, "transfer_s": 0.0, "restore_s": 0.0}
        t1 = time.perf_counter()
        parts["reform_s"] = t1 - t0
        if spec.source == KEEP:
            if spec.replica >= 0:  # a unit joins: every process takes the replica's state
                self.sharded.broadcast_from(spec.replica)
                parts["transfer_s"] = time.perf_counter() - t1
        elif spec.source == CHECKPOINT:
            self.sharded.load(Path(spec.path), strict=spec.strict)
            self.sharded.trainer.version = spec.version
            parts["restore_s"] = time.perf_counter() - t1
        elif spec.path:
            self.load_weights(spec.path)
            parts["restore_s"] = time.perf_counter() - t1
        return parts

    def leave(self, offload: str = "", version: int = 0) -> dict[str, float]:
        """Leave the group; with ``offload`` every member (a collective: all leave at once)
        first writes its shards there as a sharded checkpoint of ``version``."""
        t0 = time.perf_counter()
        if offload and self.sharded is not None:
            self.sharded.save(Path(offload), version)
        self._disband()
        return {"offload_s": time.perf_counter() - t0 if offload else 0.0}

    def _disband(self) -> None:
        self.sharded = None
        self.aborter.forget()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def abort(self) -> int:
        """End this process's collectives now (from another thread, while one is blocked
        on a lost peer): the blocked call raises, the groups are gone, the shards stay
        (the next :meth:`form` keeps them or reads the offload). Returns the connections
        shut (gloo)."""
        return self.aborter.abort()

    # ------------------------------------------------------------------ work

    def step(
        self, mine: list[PackedSample], rounds: int, total: float, version: int
    ) -> dict[str, float]:
        return self._trainer().step_shard(mine, rounds, total, version)

    def sft(
        self, mine: list[PackedSample], rounds: int, targets: int, lr: float
    ) -> dict[str, float]:
        return self._trainer().sft_shard(mine, rounds, targets, lr)

    def reset_optimizer(self) -> None:
        self._trainer().trainer.reset_optimizer()

    def load_weights(self, path: str) -> None:
        """Full weights from a file (``warm_start.weights``): every member reads it."""
        self._trainer().load_full_weights(load_file(path))

    def gather(self) -> dict[str, torch.Tensor] | None:
        """The full weights (a collective): on the group's first process, else None."""
        first = dist.get_rank() == 0
        full = self._trainer().full_state_dict(keep=first)
        return full if first else None

    def write_weights(self, path: str) -> None:
        """The full weights as one safetensors file, written by the first process."""
        full = self.gather()
        if full is not None:
            tmp = Path(path).with_suffix(".tmp")
            save_file({k: v.contiguous() for k, v in full.items()}, str(tmp))
            tmp.replace(path)

    def save(self, path: str, version: int) -> None:
        self._trainer().save(Path(path), version)

    def load(self, path: str) -> int:
        """The weights and moments of a sharded checkpoint (a warm-start cache entry)."""
        return self._trainer().load(Path(path), strict=False)
