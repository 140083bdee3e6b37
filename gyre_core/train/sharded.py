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
count of fresh tokens (the sum of their ``scale``: ``losses.count_fresh``), so a step's update does not depend on the width (the processes and
units taking part), up to the order of floating-point sums.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from gyre_core.train.collectives import (
    BROADCAST_BYTES,
    adamw_step,
    broadcast_plan,
    broadcast_run,
    byte_runs,
    served_device_types,
)
from gyre_core.train.config import PRECISIONS
from gyre_core.train.losses import LossStats, count_fresh
from gyre_core.train.sharded_checkpoint import load_state, save_state
from gyre_core.train.trainer import Trainer, demo_sample, shard_by_tokens
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.sample import PackedSample


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
    initial weights (the same on every process), and of its KL reference when it has one;
    sharding replaces them by this process's shards and rebuilds the optimizer over the
    shards with the trainer's settings."""

    def __init__(self, trainer: Trainer, mesh: DeviceMesh, precision: str | None = None) -> None:
        """``precision``: the trainer's ``train.precision`` (a different one is refused:
        every process must compute alike, or the collectives of a step disagree)."""
        precision = precision or trainer.config.precision
        if precision != trainer.config.precision:
            raise ValueError(
                f"ShardedTrainer precision {precision!r} differs from the trainer's "
                f"train.precision {trainer.config.precision!r}"
            )
        self.trainer, self.mesh = trainer, mesh
        policy = mixed_precision(precision)
        for model in (trainer.model, trainer.ref_model):  # the KL reference alike
            if model is not None:
                for layer in decoder_layers(model):
                    fully_shard(layer, mesh=mesh, mp_policy=policy)
                fully_shard(model, mesh=mesh, mp_policy=policy)
        self.model: FSDPModule = trainer.model  # type: ignore[assignment]
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
        return self.step_shard(shards[self.rank], max(len(x) for x in shards), total, cv)

    def step_shard(
        self, mine: Sequence[PackedSample], rounds: int, total: float, current_version: int
    ) -> dict[str, float]:
        """This process's part of a step whose batch (``total``: its ``count_fresh``) was split
        over the processes: ``mine`` are its samples, ``rounds`` the most any process got.
        Every process calls it (a collective); the metrics are the whole step's."""
        t = self.trainer
        t.version = current_version

        def loss(s: PackedSample) -> tuple[torch.Tensor | None, LossStats]:
            return t._sample_loss(s, current_version, total / self.world)

        stats = self._accumulate(mine, rounds, loss)
        return {**stats.summary(t.config.kl_coef), **t._optimizer_step(), "skipped": 0.0}

    def sft_shard(
        self, mine: Sequence[PackedSample], rounds: int, targets: int, lr: float
    ) -> dict[str, float]:
        """This process's part of a supervised step (``Trainer.sft_step``) at rate ``lr``
        on a batch of ``targets`` target tokens split over the processes; a collective.
        The version is not advanced (a warm start ends at version 0)."""
        t = self.trainer
        version, rates = t.version, [g["lr"] for g in t.optimizer.param_groups]
        for g in t.optimizer.param_groups:
            g["lr"] = lr

        def loss(s: PackedSample) -> tuple[torch.Tensor | None, LossStats]:
            value = t._sft_loss(s, targets / self.world)
            return value, LossStats(objective=float(value.detach()))

        stats = self._accumulate(mine, rounds, loss)
        out = t._optimizer_step()
        for g, rate in zip(t.optimizer.param_groups, rates, strict=True):
            g["lr"] = rate
        t.version = version
        return {"sft_loss": stats.objective / self.world, "grad_norm": out["grad_norm"]}

    def _accumulate(
        self,
        mine: Sequence[PackedSample],
        rounds: int,
        loss_of: Callable[[PackedSample], tuple[torch.Tensor | None, LossStats]],
    ) -> LossStats:
        """Backward of every sample of ``mine``, ``rounds`` microbatches in all, and the
        stats summed over the processes (see the module docstring)."""
        # Every forward and backward gathers the shards of the parameters (a collective),
        # so every process runs the same number of microbatches: the lightest pad theirs
        # with a probe weighted 0. Gradients accumulate without communication until the
        # last microbatch, whose backward reduces them (FSDP averages over the processes:
        # each normalises by its share of the global token count, so the average is the
        # gradient of sum(losses) / total).
        t = self.trainer
        rounds = max(1, rounds, len(mine))
        t.model.train()
        t.optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        for i in range(rounds):
            self.model.set_requires_gradient_sync(i == rounds - 1)
            loss = None
            if i < len(mine):
                loss, st = loss_of(mine[i])
                stats.add(st)
            torch.autograd.backward(loss if loss is not None else self._probe_loss())
        return self._all_sum(stats)

    def _probe_loss(self) -> torch.Tensor:
        """A two-token forward weighted 0: a process's part in a microbatch it has no
        sample for (its gradient adds nothing). The KL reference's forward follows, as in a
        sample's loss: its shards are gathered by every process, so every process runs it."""
        probe = demo_sample([0], [0])
        t = self.trainer
        ids = torch.from_numpy(probe.input_ids[None]).to(t.device)
        logits: torch.Tensor = t.model(input_ids=ids, use_cache=False).logits
        if t.ref_model is not None:
            with torch.no_grad():
                t.ref_model(input_ids=ids, use_cache=False)
        return logits.float().sum() * 0.0

    def _all_sum(self, stats: LossStats) -> LossStats:
        # On the training device: NCCL serves CUDA tensors only (float64 included).
        vec = torch.tensor(astuple(stats), dtype=torch.float64, device=self.trainer.device)
        dist.all_reduce(vec)
        return LossStats(*(float(x) for x in vec.tolist()))

    def full_state_dict(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, gathered one tensor at a time (a collective: every
        process must call it); ``keep=False``: take part without keeping them (an empty
        dict), so that only the process that returns them holds the whole model."""
        return dict(self.iter_full(keep))

    def iter_full(self, keep: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Each full weight in turn, on the CPU in float32, gathered as it is reached (a
        collective: every process iterates to the end; ``keep=False`` yields nothing)."""
        for name, value in self.trainer.model.state_dict().items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if keep:
                yield name, full.detach().to("cpu", torch.float32).clone()
            del full

    # ------------------------------------------------------------------ elastic width

    def local_state(self) -> LocalState:
        """This process's shards of the weights, the KL reference and the AdamW state: the
        tensors themselves, not copies (what a process keeps across a re-formed group: the
        shard layout is the same at any number of units). The trainer must not step once
        they are taken; the next group's trainer adopts them (:meth:`set_local_state`)."""
        t = self.trainer
        ref = t.ref_model
        for model in (t.model, ref):  # a step cut short (an abort) may hold gathered weights
            for module in model.modules() if model is not None else ():
                if isinstance(module, FSDPModule):
                    module.reshard()
        return LocalState(
            {n: _local(p).detach() for n, p in t.model.named_parameters()},
            {
                n: {k: _local(v).detach() for k, v in t.optimizer.state[p].items()}
                for n, p in t.params
                if t.optimizer.state.get(p)
            },
            {n: _local(p).detach() for n, p in ref.named_parameters()} if ref else {},
        )

    def set_local_state(self, state: LocalState | None) -> None:
        """Take what :meth:`local_state` kept (this process's shard coordinate must be the
        same as when it was taken: the number of processes per unit never changes). A
        trainer built on the meta device (:meth:`on_meta`) adopts the tensors as they are,
        no copy, and ``None`` gives it empty shards to fill (``broadcast_from``, ``load``);
        a trainer with weights of its own copies them in."""
        t = self.trainer
        if self.on_meta():
            device = torch.device(self.mesh.device_type)
            _adopt(t.model, state.params if state else {}, device)
            if t.ref_model is not None:
                _adopt(t.ref_model, state.ref if state else {}, device)
            t.rebuild_optimizer()
            if state is not None:
                for n, p in t.params:
                    if n in state.optim:
                        t.optimizer.state[p] = {
                            k: _like(p, v, copy=False) if v.dim() else v
                            for k, v in state.optim[n].items()
                        }
            return
        if state is None:
            raise ValueError("a trainer with weights of its own takes a state, not None")
        with torch.no_grad():
            for n, p in t.params:
                _local(p).copy_(state.params[n])
        t.optimizer.state.clear()
        for n, p in t.params:
            if n in state.optim:
                t.optimizer.state[p] = {
                    k: _like(p, v) if v.dim() else v.clone() for k, v in state.optim[n].items()
                }

    def on_meta(self) -> bool:
        """Whether this trainer's weights are still on the meta device (built without
        them: :meth:`set_local_state` gives them)."""
        return any(p.is_meta for _, p in self.trainer.params)

    def broadcast_from(self, replica: int) -> None:
        """Every process takes the weights and AdamW state of the process at its own shard
        coordinate in unit ``replica`` (a collective over the ``replicate`` dimension): a
        unit that joins receives the state its peers hold. The source's moment layout
        (which parameters have which moments) goes first, so that every process sends and
        receives the same tensors in the same order. The tensors travel in one buffer per
        (device, dtype) group: AdamW keeps its ``step`` counts on the CPU beside CUDA
        moments, and a group on a device the backend does not serve (the CPU under NCCL)
        is broadcast from the training device and copied back (:func:`broadcast_plan`)."""
        t = self.trainer
        group = self.mesh.get_group("replicate")
        src = dist.get_global_rank(group, replica)
        mine = {n: sorted(t.optimizer.state[p]) for n, p in t.params if t.optimizer.state.get(p)}
        layout = [mine]
        dist.broadcast_object_list(layout, src=src, group=group)
        keys: dict[str, list[str]] = layout[0]
        options = {id(p): g for g in t.optimizer.param_groups for p in g["params"]}
        for n, p in t.params:  # the source's layout: moments made or dropped to match it
            if n not in keys:
                t.optimizer.state.pop(p, None)
            elif sorted(t.optimizer.state.get(p, {})) != keys[n]:
                t.optimizer.state[p] = {
                    k: adamw_step(p, options[id(p)]) if k == "step" else torch.zeros_like(p)
                    for k in keys[n]
                }
        tensors = []
        for n, p in t.params:
            tensors.append(_local(p))
            tensors += [_local(t.optimizer.state[p][k]) for k in keys.get(n, [])]
        served = served_device_types(group)
        with torch.no_grad():  # buffers of one (device, dtype), at most BROADCAST_BYTES each
            for part in broadcast_plan([(x.device, x.dtype) for x in tensors], served, t.device):
                for run in byte_runs([tensors[i] for i in part.members], BROADCAST_BYTES):
                    broadcast_run(run, part.via, src, group)

    def load_full_weights(self, state: dict[str, Any]) -> None:
        """Take full (unsharded) weights, the same on every process, into the shards
        (a warm-start file). Raises ``ValueError`` naming what does not fit."""
        try:
            set_model_state_dict(
                self.trainer.model, state, options=StateDictOptions(full_state_dict=True)
            )
        except (RuntimeError, KeyError, ValueError) as e:
            raise ValueError(str(e).splitlines()[0]) from None

    # ------------------------------------------------------------------ checkpoints

    def save(self, directory: Path, version: int | None = None) -> None:
        """A sharded checkpoint of every process's shards (a collective): :func:`save_state`."""
        save_state(self.trainer, directory, version)
        dist.barrier()

    def load(self, directory: Path, *, strict: bool = True) -> int:
        """Continue from a checkpoint :meth:`save` wrote (:func:`load_state`)."""
        return load_state(self.trainer, directory, strict=strict)


@dataclass(frozen=True, slots=True)
class LocalState:
    """One process's shards: ``params`` by name, ``optim`` the AdamW state by parameter
    name (absent for a fresh optimizer), ``ref`` the KL reference's by name (empty when
    the trainer has none)."""

    params: dict[str, torch.Tensor]
    optim: dict[str, dict[str, torch.Tensor]]
    ref: dict[str, torch.Tensor] = field(default_factory=dict)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _like(param: torch.Tensor, local: torch.Tensor, copy: bool = True) -> torch.Tensor:
    """``local`` as a tensor laid out like ``param`` (a DTensor shard, or plain); a copy
    unless ``copy=False`` (then the same storage)."""
    local = local.clone() if copy else local
    if isinstance(param, DTensor):
        return DTensor.from_local(
            local,
            param.device_mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return local


def _adopt(model: torch.nn.Module, locals_: dict[str, torch.Tensor], device: torch.device) -> None:
    """Give each parameter of ``model`` (sharded on the meta device) the local shard
    ``locals_`` holds for its name, as it is, or an empty one; a weight tied to another
    (a tied embedding) stays tied. FSDP2 takes the new tensors as its shards
    (``reset_sharded_param``, which also pads a shard that needs it)."""
    swap: dict[int, torch.nn.Parameter] = {}
    for name, p in model.named_parameters():
        if not p.is_meta:  # a model with weights of its own (a reference read from disk)
            continue
        local = locals_.get(name)
        if local is None:
            local = torch.empty(_local(p).shape, dtype=p.dtype, device=device)
        swap[id(p)] = torch.nn.Parameter(_like(p, local, copy=False), p.requires_grad)
    for module in model.modules():
        for key, value in module._parameters.items():
            if value is not None and id(value) in swap:
                module._parameters[key] = swap[id(value)]
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:  # torch releases with one group a module
                one = getattr(state, "_fsdp_param_group", None)
                groups = [one] if one is not None else []
            for group in groups:
                for fsdp_param in group.fsdp_params:
                    fsdp_param.reset_sharded_param()
