"""The trainer's side of the NCCL weight route (:mod:`gyre_core.rollout.nccl_sync`).

Every process of the training group takes part (the weights are sharded: gathering one is
a collective); the group's first process is rank 0 of the broadcast group and sends. A
weight is gathered where it lives (the GPU), cast there to the dtype the engines serve and
broadcast from there: it never goes through the host, and nothing goes through Ray's object
store. A weight tied to another (one parameter under two names, as
``tie_word_embeddings`` makes ``lm_head.weight`` of the embedding) is gathered and sent
once; vLLM's model ties it again on its side.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from gyre_core.rollout.nccl_sync import GlooGroup, NcclGroup, Plan, Spec
from gyre_core.rollout.vllm_ext.gyre_weights import DTYPES, group_of


def tied_names(model: torch.nn.Module) -> set[str]:
    """The names in ``model``'s state dict whose tensor is an earlier name's: the same
    parameter under a second name, and ``lm_head.weight`` when the config ties the word
    embeddings. The same on every process (it reads the module tree, not the shards)."""
    first: dict[int, str] = {}
    out: set[str] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out.add(name)
        else:
            first[id(p)] = name
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        out |= {
            n for n in model.state_dict() if n == "lm_head.weight" or n.endswith(".lm_head.weight")
        }
    return out


def specs(model: torch.nn.Module, dtype: str) -> list[Spec]:
    """What an update sends, in order: each weight of the state dict (its full shape, no
    gather), in ``dtype``, tied ones once."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    skip = tied_names(model)
    return [
        (name, dtype, tuple(value.shape))
        for name, value in model.state_dict().items()
        if name not in skip
    ]


def served(
    model: torch.nn.Module, plan: Plan, device: torch.device, keep: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each weight of ``plan`` in order, gathered (a collective: every process iterates to
    the end) and cast on ``device`` to the plan's dtype; yielded where ``keep``."""
    state = model.state_dict()
    for bucket in plan.buckets:
        for name, dtype, shape in bucket:
            value = state[name]
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if tuple(full.shape) != tuple(shape):
                raise ValueError(f"{name}: shape {tuple(full.shape)}, the plan says {shape}")
            if keep:
                yield name, full.detach().to(device=device, dtype=DTYPES[dtype]).contiguous()
            del full


class WeightOut:
    """One training process's part: ``plan`` (what an update sends), ``open`` (rank 0: a
    new broadcast group; its unique id, or the gloo store's port), ``send`` (one update;
    rank 0 joins the group first when it is new)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, rank: int) -> None:
        self.model, self.device, self.rank = model, device, rank
        self.group: NcclGroup | GlooGroup | None = None
        self.world = 0
        self.joined = False

    def plan(self, dtype: str, max_bytes: int) -> Plan:
        return Plan.of(specs(self.model, dtype), max_bytes)

    def open(self, world: int, address: str = "127.0.0.1") -> bytes | int:
        """A new group of ``world`` ranks (rank 0 only): on CUDA its NCCL unique id, on the
        CPU the port of the gloo stand-in's store at ``address``."""
        if self.rank != 0:
            raise RuntimeError("only the training group's first process opens the weight group")
        self.close()
        self.world, self.joined = world, False
        if self.device.type == "cuda":
            self.group = NcclGroup(self.device)
            return self.group.uid
        self.group = GlooGroup(address, 0, 0, world)
        return self.group.port

    def send(self, plan: Plan) -> int:
        """One update (a collective of the training group): every process gathers each
        weight; rank 0 broadcasts it. The bytes rank 0 broadcast."""
        keep = self.rank == 0
        if keep and self.group is None:
            raise RuntimeError("WeightOut.send before open")
        sent = 0
        if keep and not self.joined:
            assert self.group is not None
            self.group.join(self.world)
            self.joined = True
        for _, t in served(self.model, plan, self.device, keep):
            assert self.group is not None
            self.group.broadcast(t)
            sent += t.nbytes
        return sent

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group, self.joined = None, False


def gather_buckets(
    model: torch.nn.Module, first: bool, bucket_bytes: int, dtype: str, drop_tied: bool
) -> list[Any] | None:
    """The object-store route in the engines' dtype: each
    weight gathered (a collective), cast to ``dtype`` where it lives and only then copied
    to the host and put in Ray's object store, a bucket (whole layers, at most
    ``bucket_bytes`` unless one is larger) at a time by the ``first`` process, which
    keeps none; with ``drop_tied`` a tied weight goes once (an engine that loads through
    the model's ``load_weights`` ties it again). The references on the first process."""
    import ray

    skip = tied_names(model) if drop_tied else set()
    cast = DTYPES[dtype]
    refs: list[Any] = []
    chunk: dict[str, torch.Tensor] = {}
    size, last = 0, ""
    for name, value in model.state_dict().items():
        if name in skip:
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if first:
            host = full.detach().to(cast).to("cpu", copy=True)
            if chunk and size + host.nbytes > bucket_bytes and group_of(name) != last:
                refs.append(ray.put(chunk))
                chunk, size = {}, 0
            chunk[name], size, last = host, size + host.nbytes, group_of(name)
        del full
    if chunk:
        refs.append(ray.put(chunk))
    return refs if first else None
