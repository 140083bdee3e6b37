"""Collectives on the training device: which device a tensor travels on.

``gloo`` takes CPU and CUDA tensors; ``nccl`` CUDA ones only ("No backend type associated
with device type cpu"), float64 included. AdamW keeps each parameter's ``step`` count on
the CPU (unless ``capturable`` or ``fused``) beside CUDA moments, so state moved between
processes goes in one buffer per (device, dtype) group (:func:`broadcast_plan`), and a
group on a device the backend does not serve travels on the training device.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

BROADCAST_BYTES = 64 * 1024 * 1024  # a state transfer's largest buffer beyond the state


def byte_runs(tensors: Sequence[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """``tensors`` cut, in order, into runs of at most ``limit`` bytes each (a tensor larger
    than ``limit`` alone in its run): every process cuts its same-shaped list alike, and no
    buffer of the whole state is made (a joining unit's peak memory stays near its state)."""
    runs: list[list[torch.Tensor]] = []
    size = 0
    for x in tensors:
        nbytes = x.numel() * x.element_size()
        if not runs or size + nbytes > limit:
            runs.append([])
            size = 0
        runs[-1].append(x)
        size += nbytes
    return runs


@dataclass(frozen=True, slots=True)
class BroadcastGroup:
    """Tensors broadcast as one buffer: ``members`` (indices into the list planned) share
    ``device`` and ``dtype``; the buffer travels on ``via`` (``device``, or the training
    device when the backend does not serve ``device``'s type)."""

    device: torch.device
    dtype: torch.dtype
    via: torch.device
    members: list[int]


def broadcast_plan(
    tensors: Sequence[tuple[torch.device, torch.dtype]],
    served: Collection[str],
    home: torch.device,
) -> list[BroadcastGroup]:
    """``tensors`` (each one's device and dtype) grouped by device and dtype, in an order
    every process computes alike; ``served``: the device types the group's backend takes
    (:func:`served_device_types`), ``home``: the training device, which carries a group
    the backend does not serve. Raises ``ValueError`` when neither is served."""
    home = torch.device(home)
    if home.type not in served:
        raise ValueError(f"the backend serves {sorted(served)}, not the training device {home}")
    groups: dict[tuple[str, str], BroadcastGroup] = {}
    for i, (device, dtype) in enumerate(tensors):
        device = torch.device(device)
        key = (str(device), str(dtype))
        if key not in groups:
            via = device if device.type in served else home
            groups[key] = BroadcastGroup(device, dtype, via, [])
        groups[key].members.append(i)
    return [groups[k] for k in sorted(groups)]


def served_device_types(group: dist.ProcessGroup | None = None) -> set[str]:
    """The device types ``group``'s backend takes tensors on (``gloo``: CPU and CUDA,
    ``nccl``: CUDA only; a ``"cpu:gloo,cuda:nccl"`` group each it names)."""
    name = str(dist.get_backend(group))
    if ":" in name:
        return {part.split(":", 1)[0] for part in name.split(",")}
    return set(dist.Backend.backend_capability.get(name.lower(), []))


def adamw_step(param: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    """A fresh ``step`` count for ``param``'s AdamW state, where AdamW itself puts it
    (``torch.optim.Adam._init_group``): on the parameter's device when ``capturable`` or
    ``fused``, else on the CPU; float32, or float64 when that is the default dtype and
    the optimizer is not fused."""
    fused, capturable = bool(options.get("fused")), bool(options.get("capturable"))
    wide = torch.get_default_dtype() == torch.float64 and not fused
    dtype = torch.float64 if wide else torch.float32
    return torch.zeros(
        (),
        dtype=dtype,
        device=(param.to_local() if isinstance(param, DTensor) else param).device
        if fused or capturable
        else "cpu",
    )


def broadcast_run(
    xs: list[torch.Tensor], via: torch.device, src: int, group: dist.ProcessGroup
) -> None:
    """Broadcast ``xs`` (one device and dtype) from ``src`` as one buffer on ``via``; a lone
    contiguous tensor already on ``via`` travels in place (no copy)."""
    if len(xs) == 1 and xs[0].device == via and xs[0].is_contiguous():
        dist.broadcast(xs[0], src=src, group=group)
        return
    flat = torch.cat([x.reshape(-1).to(via) for x in xs])
    dist.broadcast(flat, src=src, group=group)
    for x, piece in zip(xs, torch.split(flat, [x.numel() for x in xs]), strict=True):
        x.copy_(piece.view_as(x))
