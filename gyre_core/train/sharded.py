"""A training unit as a shard group, the training units as replicas (hybrid sharding).

Each process of a training unit holds a shard of the parameters, gradients and AdamW state
(FSDP2, ``torch.distributed.fsdp.fully_shard``, per decoder layer and at the root); the
units replicate each other and all-reduce gradients. The device mesh has two dimensions,
``("replicate", "shard")``: units x processes per unit. The same code runs on CUDA with NCCL
and on CPU with gloo (how the test suite exercises it).

:class:`ShardedTrainer` wraps a :class:`~gyre_core.train.trainer.Trainer` built on every
process from the same weights: the loss, the trees and the packing are the trainer's own.
A step splits the batch's packed samples over all processes (``shard_by_tokens``), each
process accumulates the gradients of its samples without communication (every process runs
as many microbatches as the busiest, padding with a probe weighted 0), and the last
microbatch's backward reduces them; every process's loss is normalised by the *global*
count of fresh tokens, so a step's update does not depend on the width (the processes and
units taking part), up to the order of floating-point sums.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import astuple
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from gyre_core.train.config import PRECISIONS
from gyre_core.train.losses import LossStats, count_fresh
from gyre_core.train.trainer import Trainer, demo_sample, shard_by_tokens
from gyre_core.trajectory.format import Rollout

TRAINER_FILE = "trainer.json"  # a sharded checkpoint's version and trainer settings


def unit_mesh(units: int, per_unit: int, device: str = "cpu") -> DeviceMesh:
    """The ``(replicate, shard)`` mesh of ``units`` training units of ``per_unit`` processes
    each, over the default process group (its world size must be their product)."""
    world = dist.get_world_size()
    if units * per_unit != world:
        raise ValueError(f"{units} units x {per_unit} processes != world size {world}")
    return init_device_mesh(device, (units, per_unit), mesh_dim_names=("replicate", "shard"))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks a causal LM shards one by one (``model.model.layers`` in
    transformers' decoders); empty when the model has none (then only the root is)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


class ShardedTrainer:
    """One process of a training unit. ``trainer`` holds this process's full copy of the
    initial weights (the same on every process); sharding replaces them by this process's
    shard and rebuilds the optimizer over the shards with the trainer's settings."""

    def __init__(self, trainer: Trainer, mesh: DeviceMesh, precision: str = "fp32") -> None:
        if trainer.ref_model is not None:
            raise ValueError("ShardedTrainer: a KL reference model is not sharded yet")
        self.trainer, self.mesh = trainer, mesh
        policy = mixed_precision(precision)
        model = trainer.model
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.model: FSDPModule = model  # type: ignore[assignment]
        trainer.rebuild_optimizer()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    @property
    def version(self) -> int:
        return self.trainer.version

    def step(
        self, rollouts: Iterable[Rollout], current_version: int | None = None
    ) -> dict[str, float]:
        """One RL step on the whole batch ``rollouts`` (every process passes the same);
        returns the step's metrics, summed over all processes. A batch with no fresh token
        leaves the weights and version as they were (``skipped``), as ``Trainer.step``."""
        t = self.trainer
        cv = t.version if current_version is None else current_version
        samples = t.prepare(rollouts, cv)
        total = count_fresh(samples, cv, t.staleness_bound)
        if total == 0:
            return t.skipped(samples, cv)
        shards = shard_by_tokens(samples, self.world)
        mine = shards[self.rank]
        # Every forward and backward gathers the shards of the parameters (a collective),
        # so every process runs the same number of microbatches: the lightest pad theirs
        # with a probe weighted 0. Gradients accumulate without communication until the
        # last microbatch, whose backward reduces them (FSDP averages over the processes:
        # each normalises by its share of the global token count, so the average is the
        # gradient of sum(losses) / total).
        rounds = max(1, max(len(x) for x in shards))
        t.model.train()
        t.optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        for i in range(rounds):
            self.model.set_requires_gradient_sync(i == rounds - 1)
            loss = None
            if i < len(mine):
                loss, st = t._sample_loss(mine[i], cv, total / self.world)
                stats.add(st)
            torch.autograd.backward(loss if loss is not None else self._probe_loss())
        stats = self._all_sum(stats)
        return {**stats.summary(t.config.kl_coef), **t._optimizer_step(), "skipped": 0.0}

    def _probe_loss(self) -> torch.Tensor:
        """A two-token forward weighted 0: a process's part in a microbatch it has no
        sample for (its gradient adds nothing)."""
        probe = demo_sample([0], [0])
        dev = self.trainer.device
        ids = torch.from_numpy(probe.input_ids[None]).to(dev)
        logits: torch.Tensor = self.trainer.model(input_ids=ids, use_cache=False).logits
        return logits.float().sum() * 0.0

    def _all_sum(self, stats: LossStats) -> LossStats:
        vec = torch.tensor(astuple(stats), dtype=torch.float64)
        dist.all_reduce(vec)
        return LossStats(*(float(x) for x in vec))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, gathered on every process (a collective: every
        process must call it): for export and tests, never kept on a driver."""
        out = {}
        for name, value in self.trainer.model.state_dict().items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            out[name] = full.detach().to("cpu", torch.float32).clone()
        return out

    def save(self, directory: Path) -> None:
        """A sharded checkpoint (``torch.distributed.checkpoint``): every process writes
        its shards of the weights and the AdamW state (a collective), the first also
        ``trainer.json`` (version, settings). It loads at any width (:meth:`load`)."""
        model_sd, optim_sd = get_state_dict(self.trainer.model, self.trainer.optimizer)
        dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))
        if self.rank == 0:
            meta = {"version": self.trainer.version, "settings": self.trainer.settings()}
            (Path(directory) / TRAINER_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        dist.barrier()

    def load(self, directory: Path) -> None:
        """Continue from a checkpoint :meth:`save` wrote, at this trainer's width (the same
        as the writer's or another: each process reads the parts of the shards it holds
        now). A checkpoint of other trainer settings is refused by name."""
        meta = json.loads((Path(directory) / TRAINER_FILE).read_text())
        mine = json.loads(json.dumps(self.trainer.settings()))
        theirs = meta["settings"]
        diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        if diff:
            other = ", ".join(diff)
            raise ValueError(f"{directory}: a checkpoint of other trainer settings ({other})")
        model_sd, optim_sd = get_state_dict(self.trainer.model, self.trainer.optimizer)
        dcp_load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))
        set_state_dict(
            self.trainer.model,
            self.trainer.optimizer,
            model_state_dict=model_sd,
            optim_state_dict=optim_sd,
        )
        self.trainer.version = int(meta["version"])
