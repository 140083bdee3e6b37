"""Weights in buckets: the wire layout both ends of a bucketed weight update share.

A state dict is cut into buckets of at most ``bucket_bytes`` (a tensor larger than that is
a bucket of its own). Each bucket is one flat byte buffer; an :class:`Entry` says where
each tensor lies in it (64-byte aligned, so every dtype can be viewed in place), in the
dtype the engine serves. The sender :func:`pack`\\ s a bucket into a buffer (a shared-memory
file on the CPU, a CUDA tensor whose IPC handle travels on a GPU); the engine's worker
:func:`unpack`\\ s views of it and hands them to its model's ``load_weights``.

This file imports only torch and the standard library: the vLLM server's worker imports it
as the top-level module ``gyre_weights`` (its folder is on that process's ``PYTHONPATH``),
Gyre as ``gyre_core.rollout.vllm_ext.gyre_weights``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

ALIGN = 64
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of a bucket: ``nbytes`` bytes at ``offset``, ``dtype`` (a key of
    :data:`DTYPES`) of ``shape``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        n = DTYPES[self.dtype].itemsize
        for d in self.shape:
            n *= d
        return n

    def to_wire(self) -> list[object]:
        return [self.name, self.dtype, list(self.shape), self.offset]

    @staticmethod
    def from_wire(item: list[object]) -> Entry:
        name, dtype, shape, offset = item
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return Entry(str(name), str(dtype), tuple(int(d) for d in shape), int(offset))  # type: ignore[attr-defined, call-overload]


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def group_of(name: str) -> str:
    """The tensors that travel in one bucket: a decoder layer's (``...layers.<n>``), else
    a module's (the name without its last part)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return ".".join(parts[:-1])


def plan_buckets(
    shapes: Iterable[tuple[str, tuple[int, ...]]], dtype: str, bucket_bytes: int
) -> list[list[Entry]]:
    """Buckets of the named shapes, in order, each at most ``bucket_bytes`` unless one group
    (:func:`group_of`) alone is larger. A group is never split: a layer's weights arrive
    together, and the engine can process the layer as soon as its bucket is in."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    groups: list[list[tuple[str, tuple[int, ...]]]] = []
    for name, shape in shapes:
        if groups and group_of(groups[-1][-1][0]) == group_of(name):
            groups[-1].append((name, tuple(shape)))
        else:
            groups.append([(name, tuple(shape))])
    buckets: list[list[Entry]] = [[]]
    used = 0
    for group in groups:
        size = sum(_aligned(Entry(n, dtype, s, 0).nbytes) for n, s in group)
        if buckets[-1] and used + size > bucket_bytes:
            buckets.append([])
            used = 0
        for name, shape in group:
            entry = Entry(name, dtype, shape, used)
            buckets[-1].append(entry)
            used = _aligned(used + entry.nbytes)
    return [b for b in buckets if b]


def bucket_bytes(bucket: list[Entry]) -> int:
    """The buffer size a bucket needs."""
    last = bucket[-1]
    return last.offset + last.nbytes


def pack(state: Mapping[str, torch.Tensor], bucket: list[Entry], out: torch.Tensor) -> None:
    """Copy each tensor of ``bucket`` from ``state`` (cast to the bucket's dtype) into the
    flat ``uint8`` buffer ``out`` (on any device)."""
    for e in bucket:
        view = out[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)
        view.copy_(state[e.name].detach(), non_blocking=True)


def unpack(buf: torch.Tensor, bucket: list[Entry]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of ``bucket``'s tensors in the flat ``uint8`` buffer."""
    for e in bucket:
        end = e.offset + e.nbytes
        if end > buf.numel():
            raise ValueError(
                f"{e.name}: bytes {e.offset}..{end} outside a {buf.numel()}-byte buffer"
            )
        yield e.name, buf[e.offset : end].view(DTYPES[e.dtype]).view(e.shape)
