"""Weights straight from the trainer to every engine over NCCL: vLLM's ``nccl`` backend.

The trainer's first process is rank 0 of one broadcast group; every worker of every engine
(each of its tensor-parallel GPUs) is another rank (:func:`layout`). The servers run with
``--weight-transfer-config '{"backend": "nccl"}'``; the trainer's side
(:mod:`gyre_core.train.weight_out`) needs no vLLM:

* forming the group: the trainer mints an NCCL unique id; each engine's unit posts
  :func:`nccl_init_body` to ``/init_weight_transfer_engine`` (vLLM's
  ``NCCLWeightTransferInitInfo`` in its unique-id mode: ``nccl_unique_id_b64``,
  ``rank_offset``, ``world_size``, ``packed: false``) while the trainer joins as rank 0;
  every rank then runs vLLM's warm-up, a one-float all-reduce. Formed again only when the
  set of engines changes.
* an update: the weights are planned once, in order, as buckets of ``(name, dtype,
  shape)`` (:class:`Plan`, tied weights once). Each rollout unit runs :func:`receive` on
  its engine: paused with requests kept, ``/start_weight_update``, one ``/update_weights``
  per bucket (:func:`nccl_update_body`: names, dtype names, shapes), during which the
  trainer broadcasts that bucket's tensors one by one (vLLM's receiver allocates each,
  joins the broadcast and loads it), ``/finish_weight_update``, the version tag, the
  prefix-cache reset, the version read back (:meth:`VLLMEngine.update_weights`).

On a CPU machine gloo stands in for NCCL (the same ranks, order and bytes; its rendezvous
is a store instead of the unique id): :class:`GlooGroup`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_ext.gyre_weights import DTYPES, group_of

TIMEOUT = timedelta(seconds=120)  # the gloo stand-in's rendezvous and broadcasts
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

Spec = tuple[str, str, tuple[int, ...]]  # name, dtype name, shape


@dataclass(frozen=True, slots=True)
class Plan:
    """One update's tensors in the order they are broadcast, cut into buckets (each one
    ``/update_weights``)."""

    buckets: tuple[tuple[Spec, ...], ...]

    @staticmethod
    def of(specs: Sequence[Spec], max_bytes: int) -> Plan:
        """``specs`` in buckets of at most ``max_bytes`` unless one group (:func:`group_of`:
        a decoder layer, a module) is larger; a group is never split."""
        out: list[list[Spec]] = []
        size, last = 0, None
        for spec in specs:
            name, dtype, shape = spec
            nbytes = DTYPES[dtype].itemsize * _numel(shape)
            if not out or (size + nbytes > max_bytes and group_of(name) != last):
                out.append([])
                size = 0
            out[-1].append((name, dtype, tuple(shape)))
            size, last = size + nbytes, group_of(name)
        return Plan(tuple(tuple(b) for b in out))

    @property
    def nbytes(self) -> int:
        return sum(DTYPES[d].itemsize * _numel(s) for b in self.buckets for _, d, s in b)

    def to_wire(self) -> list[list[list[Any]]]:
        return [[[n, d, list(s)] for n, d, s in b] for b in self.buckets]

    @staticmethod
    def from_wire(data: list[list[list[Any]]]) -> Plan:
        return Plan(tuple(tuple((str(n), str(d), tuple(s)) for n, d, s in b) for b in data))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layout(workers: Sequence[int]) -> tuple[list[int], int]:
    """Each engine's ``rank_offset`` (engines of ``workers`` workers each: tensor x
    pipeline parallel) and the group's world size: rank 0 is the trainer, then each
    engine's workers in turn (vLLM's worker joins as ``rank_offset`` + its rank)."""
    offsets, rank = [], 1
    for w in workers:
        if w < 1:
            raise ValueError(f"an engine has at least one worker, got {w}")
        offsets.append(rank)
        rank += w
    return offsets, rank


def nccl_init_body(uid: bytes, rank_offset: int, world_size: int) -> dict[str, Any]:
    """``POST /init_weight_transfer_engine`` for the ``nccl`` backend, unique-id mode (the
    trainer shares the id it minted: no store, every rank joins at once)."""
    if len(uid) != 128:
        raise ValueError(f"an NCCL unique id has 128 bytes, got {len(uid)}")
    return {
        "init_info": {
            "nccl_unique_id_b64": base64.b64encode(uid).decode(),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "packed": False,
        }
    }


def nccl_update_body(bucket: Sequence[Spec]) -> dict[str, Any]:
    """``POST /update_weights`` for the ``nccl`` backend: the tensors the next broadcasts
    carry, in order (one broadcast per tensor, as ``packed: false`` at init said)."""
    return {
        "update_info": {
            "names": [name for name, _, _ in bucket],
            "dtype_names": [dtype for _, dtype, _ in bucket],
            "shapes": [list(shape) for _, _, shape in bucket],
        }
    }


async def receive(
    engine: VLLMEngine, plan: Plan, version: int, init: dict[str, Any] | None = None
) -> None:
    """A unit's side of one update (module docstring); ``init``: the init body when the
    group is (re)formed with this update. The trainer broadcasts meanwhile."""

    async def load() -> None:
        if init is not None:
            await engine.post("/init_weight_transfer_engine", init)
        await engine.post("/start_weight_update")
        for bucket in plan.buckets:
            await engine.post("/update_weights", nccl_update_body(bucket))
        await engine.post("/finish_weight_update", {})

    await engine.update_weights(load, version)


class NcclGroup:
    """Rank 0 of the group vLLM's workers form from a unique id
    (``PyNcclCommunicator.from_unique_id_bytes``): PyTorch's own NCCL bindings, no vLLM.
    :meth:`join` returns once every rank has joined and warmed up; it must run while the
    units post their init bodies. Both sides must load the same NCCL release."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"the NCCL weight broadcast needs a CUDA device, got {device}")
        from torch.cuda import nccl

        self.nccl, self.device = nccl, device
        self.uid: bytes = nccl.unique_id()  # type: ignore[no-untyped-call]
        self.comm: Any = None

    def join(self, world: int) -> None:
        with torch.cuda.device(self.device):
            self.comm = self.nccl.init_rank(world, self.uid, 0)  # type: ignore[no-untyped-call]
            warm = torch.zeros(1, device=self.device)  # vLLM's warm-up: all ranks, one float
            self.nccl.all_reduce([warm], comms=[self.comm])  # type: ignore[no-untyped-call]
            torch.cuda.synchronize(self.device)

    def broadcast(self, tensor: torch.Tensor) -> None:
        if tensor.device != self.device:
            raise ValueError(f"a tensor on {tensor.device}; the communicator is on {self.device}")
        self.nccl.broadcast([tensor.contiguous()], root=0, comms=[self.comm])

    def close(self) -> None:
        if self.comm is not None:
            torch.cuda.synchronize(self.device)
        self.comm = None


class GlooGroup:
    """The CPU stand-in for :class:`NcclGroup` (and its receivers): the same group over
    gloo, rendezvous at a store (rank 0 opens it: ``port`` 0 picks one)."""

    def __init__(self, address: str, port: int, rank: int, world: int) -> None:
        self.store = TCPStore(address, port, world, rank == 0, TIMEOUT, wait_for_workers=False)
        self.port, self.rank, self.world = int(self.store.port), rank, world
        self.pg: Any = None

    def join(self, world: int | None = None) -> None:
        self.pg = ProcessGroupGloo(
            PrefixStore("gyre-weights", self.store), self.rank, self.world, TIMEOUT
        )
        warm = torch.zeros(1)
        self.pg.allreduce([warm]).wait()

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        self.pg = None
