"""Bucketed weight updates into a running vLLM server (``engine.weight_sync: bucketed``).

The state is cut into buckets (:mod:`gyre_core.rollout.vllm_ext.gyre_weights`), each packed
in the served dtype into one flat buffer and handed to the server's worker, which copies it
into its model in place: no file is written, nothing is reloaded from a checkpoint, and no
more than two buckets exist at once outside the model.

* :class:`ShmSender` (CPU): two files in shared memory (``/dev/shm``) used alternately, so
  bucket k+1 is packed while the worker loads bucket k; each bucket is one ``POST
  /collective_rpc`` of ``gyre_load_bucket`` (the worker extension, ``gyre_vllm_ext``).
* :class:`CudaIpcSender` (GPU): each bucket a CUDA buffer whose IPC handle goes to vLLM's
  own ``ipc`` weight-transfer receiver (``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update``), the path colocated engines take on one GPU.

:meth:`VLLMEngine.update_weights` wraps either in the pause (requests kept), the version
tag and the prefix-cache reset, as for the disk path.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gyre_core.rollout.vllm_ext.gyre_weights import DTYPES, Entry, bucket_bytes, pack, plan_buckets

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
Post = Callable[[str, Any], Awaitable[Any]]  # (path, JSON body) -> the answer's JSON


def plan(state: Mapping[str, torch.Tensor], dtype: str, max_bytes: int) -> list[list[Entry]]:
    return plan_buckets(((k, tuple(v.shape)) for k, v in state.items()), dtype, max_bytes)


Pairs = AsyncIterator[tuple[Mapping[str, torch.Tensor], list[Entry]]]


async def of_state(state: Mapping[str, torch.Tensor], buckets: list[list[Entry]]) -> Pairs:
    """A whole state's buckets, with the state each is packed from."""
    for bucket in buckets:
        yield state, bucket


async def of_chunks(
    chunks: AsyncIterator[Mapping[str, torch.Tensor]], dtype: str, max_bytes: int
) -> Pairs:
    """The buckets of a state that arrives in chunks (the training group's buckets), each
    chunk planned as it comes: no more than one chunk is held at a time."""
    async for chunk in chunks:
        for bucket in plan(chunk, dtype, max_bytes):
            yield chunk, bucket


class ShmSender:
    """The CPU path: buckets through two shared-memory files in ``folder`` (removed by
    :meth:`close`)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or SHM_DIR / f"gyre-w-{uuid.uuid4().hex[:12]}"
        self.paths = [self.folder / f"bucket-{i}" for i in (0, 1)]
        self._bufs: list[torch.Tensor | None] = [None, None]

    def _buffer(self, i: int, size: int) -> torch.Tensor:
        buf = self._bufs[i]
        if buf is None or buf.numel() < size:
            self._bufs[i] = None  # unmapped before the file grows
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.paths[i], "a+b") as f:
                f.truncate(size)
            buf = torch.from_file(str(self.paths[i]), shared=True, size=size, dtype=torch.uint8)
            self._bufs[i] = buf
        return buf

    async def send(self, pairs: Pairs, post: Post) -> int:
        """Send each ``(state, bucket)`` as it comes; the bytes sent."""
        pending: asyncio.Task[Any] | None = None
        sent = 0
        await post("/collective_rpc", {"method": "gyre_begin_update"})
        try:
            k = -1
            async for state, bucket in pairs:
                k += 1
                i, size = k % 2, bucket_bytes(bucket)
                buf = self._buffer(i, size)  # the other one may be in the worker's hands
                await asyncio.to_thread(pack, state, bucket, buf)
                if pending is not None:
                    await pending
                spec = {
                    "path": str(self.paths[i]),
                    "size": buf.numel(),
                    "entries": [e.to_wire() for e in bucket],
                }
                body = {"method": "gyre_load_bucket", "args": [json.dumps(spec)]}
                pending = asyncio.ensure_future(post("/collective_rpc", body))
                sent += sum(e.nbytes for e in bucket)
            if pending is not None:
                await pending
            await post("/collective_rpc", {"method": "gyre_end_update"})
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
        return sent

    def close(self) -> None:
        self._bufs = [None, None]
        shutil.rmtree(self.folder, ignore_errors=True)


def ipc_init_body() -> dict[str, Any]:
    """The body of ``POST /init_weight_transfer_engine`` for vLLM's ``ipc`` backend: its
    init info (``IPCWeightTransferInitInfo``, built with ``init_info_cls(**init_info)``, so
    an unknown key is refused) holds one field, ``packed``: false, one handle per tensor."""
    return {"init_info": {"packed": False}}


def ipc_update_body(bucket: list[Entry], handles: list[dict[str, Any]]) -> dict[str, Any]:
    """The body of one ``POST /update_weights`` for vLLM's ``ipc`` backend
    (``IPCWeightTransferUpdateInfo``): the bucket's names, dtype names and shapes, and per
    tensor a ``{gpu uuid: rebuild_cuda_tensor's arguments}`` map, pickled and base64-encoded
    (``ipc_handles_pickled``: the server needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``)."""
    if len(handles) != len(bucket):
        raise ValueError(f"{len(handles)} handles for a bucket of {len(bucket)} tensors")
    return {
        "update_info": {
            "names": [e.name for e in bucket],
            "dtype_names": [e.dtype for e in bucket],
            "shapes": [list(e.shape) for e in bucket],
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
        }
    }


def handle_maps(handles: list[Any], uuids: Sequence[str]) -> list[dict[str, Any]]:
    """Each tensor's handle under every GPU uuid of the engine's tensor-parallel group.

    vLLM's ``ipc`` receiver runs in each TP worker and looks up the uuid of *its own* GPU
    (``torch.cuda.get_device_properties(its device).uuid``), then rebuilds the tensor on its
    own device from that handle (it overwrites the device index). One buffer on the sender's GPU serves every worker:
    a worker on another GPU opens the peer's handle (``cudaIpcOpenMemHandle`` with lazy
    peer access, which PyTorch's IPC uses) and reads it over NVLink while it copies into
    its shard, so the map holds the same handle under each uuid of the group. (vLLM's own
    trainer engine instead merges one handle per colocated trainer rank, each rank holding
    a copy on its GPU; a Gyre unit publishes from its first process alone.) The GPUs must
    allow peer access, as NVLink-connected ones do; where they do not, the worker's
    error comes back as the update's HTTP error."""
    if not uuids:
        raise ValueError("no GPU uuid to key the IPC handles by")
    return [dict.fromkeys(uuids, h) for h in handles]


def gpu_uuids(indices: Sequence[int]) -> list[str]:
    """The uuids (as ``str(torch.cuda.get_device_properties(i).uuid)`` prints them, no
    ``GPU-`` prefix) of the physical GPUs ``indices``, read from ``nvidia-smi``, which sees
    every GPU of the node whatever ``CUDA_VISIBLE_DEVICES`` this process has."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"cannot read the GPUs' uuids with nvidia-smi: {e!r}") from e
    return uuids_of(out, indices)


def uuids_of(csv: str, indices: Sequence[int]) -> list[str]:
    """The uuids of GPUs ``indices`` in ``nvidia-smi --query-gpu=index,uuid`` output."""
    found = {}
    for line in csv.splitlines():
        index, _, value = line.partition(",")
        if index.strip():
            found[int(index)] = value.strip().removeprefix("GPU-")
    missing = [i for i in indices if i not in found]
    if missing:
        raise RuntimeError(f"nvidia-smi lists no GPU {missing}: {csv.strip()!r}")
    return [found[i] for i in indices]


class CudaIpcSender:
    """The GPU path for an engine on the sender's own GPU(s): vLLM's ``ipc`` receiver (the
    server runs with ``--weight-transfer-config '{"backend": "ipc"}'`` and
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``); one bucket buffer on ``device`` at a time.
    ``peers``: the uuids of the engine's other GPUs (its tensor-parallel group), whose
    workers read the same buffer (:func:`handle_maps`)."""

    def __init__(self, device: torch.device, peers: Sequence[str] = ()) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"CudaIpcSender needs a CUDA device, got {device}")
        self.device = device
        own = str(torch.cuda.get_device_properties(device).uuid)
        self.uuids = [own, *(u for u in peers if u != own)]
        self._initialised = False

    async def send(self, pairs: Pairs, post: Post) -> int:
        from torch.multiprocessing.reductions import reduce_tensor

        if not self._initialised:
            await post("/init_weight_transfer_engine", ipc_init_body())
            self._initialised = True
        await post("/start_weight_update", {})
        sent = 0
        async for state, bucket in pairs:
            buf = torch.empty(bucket_bytes(bucket), dtype=torch.uint8, device=self.device)
            pack(state, bucket, buf)
            torch.cuda.synchronize(self.device)
            views = [buf[e.offset : e.offset + e.nbytes] for e in bucket]
            handles = [  # vLLM takes rebuild_cuda_tensor's arguments, not the function
                reduce_tensor(v.view(DTYPES[e.dtype]).view(e.shape))[1]  # type: ignore[no-untyped-call]
                for v, e in zip(views, bucket, strict=True)
            ]
            await post("/update_weights", ipc_update_body(bucket, handle_maps(handles, self.uuids)))
            sent += sum(e.nbytes for e in bucket)
            del buf, views, handles  # the workers copied it: the next bucket may take its memory
        await post("/finish_weight_update", {})
        return sent
