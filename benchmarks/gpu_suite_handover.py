"""The device check's weight hand-over (``benchmarks/gpu_suite.py``): the trainer's bf16
weights to an engine process on the same device, the whole route timed.

The trainer (this process) holds a Qwen3 of the given shape sharded by FSDP2
(``ShardedTrainer``, a one-process group). A hand-over gathers each full weight from its
shards, packs it into a flat bucket buffer cast to bf16 on the device
(``gyre_core/rollout/vllm_ext/gyre_weights.py``'s layout) and sends the buffer through a
``torch.multiprocessing`` pipe (a CUDA IPC handle on a GPU, the shared-memory file on the
CPU) to a child process, which copies the views into its own model of the same shape (bf16,
other random weights) and acknowledges. Two buffers alternate, so the gather and pack of
bucket k+1 overlap the receiver's copy of bucket k. Checked: the receiver's weights equal
the sender's bf16 ones after the last timed hand-over.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from benchmarks.gpu_suite_common import bench_trainer, sync
from benchmarks.gpu_suite_sections import Context, build_on, process_group
from gyre_core.rollout.vllm_ext.gyre_weights import Entry, bucket_bytes, pack, plan_buckets, unpack
from gyre_core.train.sharded import ShardedTrainer, unit_mesh


def checksums(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Per bf16 tensor: the int64 sums of its bit patterns and of their squares."""
    out = {}
    for name, t in state.items():
        bits = t.detach().reshape(-1).view(torch.int16).to(torch.int64)
        out[name] = (int(bits.sum()), int((bits * bits).sum()))
    return out


def receiver(shape: str, vocab: int, device_name: str, conn: Connection) -> None:
    """The engine's side: its own model, each bucket's views copied into its weights."""
    try:
        device = torch.device(device_name)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model = build_on(device, shape, vocab, "dense", dtype=torch.bfloat16, seed=1)
        params = dict(model.state_dict())  # views of the model's own weights
        held: dict[int, torch.Tensor] = {}  # each slot's last buffer: keeps its mapping
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "bucket":
                _, k, buf, wire = msg
                held[k % 2] = buf
                for name, view in unpack(buf, [Entry.from_wire(w) for w in wire]):
                    params[name].copy_(view, non_blocking=True)
                sync(device)  # copied: the sender may refill this buffer
                conn.send(("ack", k))
            elif msg[0] == "checksums":
                conn.send(("checksums", checksums(params)))
            else:
                return
    except BaseException:
        conn.send(("error", traceback.format_exc(limit=-8)))
        raise


class Route:
    """The sender's end: the sharded model, two bucket buffers, the pipe."""

    def __init__(self, model: Any, plan: list[list[Entry]], device: torch.device) -> None:
        self.model, self.plan, self.device = model, plan, device
        size = max(bucket_bytes(b) for b in plan)
        self.bufs = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
        if device.type == "cpu":
            self.bufs = [b.share_memory_() for b in self.bufs]  # type: ignore[no-untyped-call]
        self.wires = [[e.to_wire() for e in b] for b in plan]
        self.conn: Connection | None = None
        self.child: Any = None

    def start(self, shape: str, vocab: int, timeout: float) -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        args = (shape, vocab, str(self.device), theirs)
        self.child = ctx.Process(target=receiver, args=args, daemon=True)
        self.child.start()
        theirs.close()
        self.timeout = timeout
        self.expect("ready")

    def expect(self, kind: str) -> tuple[Any, ...]:
        """The receiver's next message, which must be ``kind``: a dead or silent receiver
        raises instead of hanging."""
        assert self.conn is not None
        deadline = time.monotonic() + self.timeout
        while not self.conn.poll(0.2):
            if not self.child.is_alive():
                raise RuntimeError(f"the receiver died (exit code {self.child.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {kind!r} from the receiver within {self.timeout:g} s")
        msg: tuple[Any, ...] = self.conn.recv()
        if msg[0] == "error":
            raise RuntimeError(f"the receiver failed:\n{msg[1]}")
        if msg[0] != kind:
            raise RuntimeError(f"expected {kind!r} from the receiver, got {msg[0]!r}")
        return msg

    def full(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The full (gathered) weights of ``names``, in their training dtype, on the device."""
        sd = self.model.state_dict()
        return {n: sd[n].full_tensor() if isinstance(sd[n], DTensor) else sd[n] for n in names}

    def hand_over(self) -> float:
        """Gather, cast, pack and send every bucket; the seconds until the last is copied."""
        assert self.conn is not None
        sent: deque[int] = deque()
        sync(self.device)
        t0 = time.perf_counter()
        for k, bucket in enumerate(self.plan):
            while sent and sent[0] <= k - 2:  # bucket k-2 used this buffer: await its copy
                self._ack(sent.popleft())
            pack(self.full([e.name for e in bucket]), bucket, self.bufs[k % 2])
            sync(self.device)
            self.conn.send(("bucket", k, self.bufs[k % 2], self.wires[k]))
            sent.append(k)
        while sent:
            self._ack(sent.popleft())
        return time.perf_counter() - t0

    def _ack(self, k: int) -> None:
        if (got := self.expect("ack")[1]) != k:
            raise RuntimeError(f"acknowledgement for bucket {got}, expected {k}")

    def close(self) -> None:
        if self.child is not None and self.child.is_alive():
            assert self.conn is not None
            self.conn.send(("stop",))
            self.child.join(30)
        if self.child is not None and self.child.is_alive():
            self.child.terminate()


def weight_handover(ctx: Context, shape: str, repeats: int = 2) -> dict[str, Any]:
    """The bf16 hand-over of ``shape`` from FSDP2 shards to a receiving process."""
    with process_group(ctx.device):
        model = build_on(ctx.device, shape, ctx.vocab, "dense")
        trainer = ShardedTrainer(
            bench_trainer(model, "dense", precision=ctx.precision),
            unit_mesh(1, 1, ctx.device.type),
        )
        del model
        sharded = trainer.trainer.model
        shapes = [(n, tuple(v.shape)) for n, v in sharded.state_dict().items()]
        plan = plan_buckets(shapes, "bfloat16", ctx.bucket_bytes)
        route = Route(sharded, plan, ctx.device)
        try:
            t0 = time.perf_counter()
            route.start(shape, ctx.vocab, ctx.timeout)
            started = time.perf_counter() - t0
            warm = route.hand_over()  # maps the IPC handles
            times = []
            for _ in range(repeats):
                with torch.no_grad():  # new values, so that the last hand-over is checked
                    for p in sharded.parameters():
                        (p.to_local() if isinstance(p, DTensor) else p).neg_()
                times.append(route.hand_over())
            assert route.conn is not None
            route.conn.send(("checksums",))
            theirs = route.expect("checksums")[1]
            mine = {n: t.to(torch.bfloat16) for n, t in route.full([n for n, _ in shapes]).items()}
            bad = [n for n, c in checksums(mine).items() if tuple(theirs[n]) != c]
        finally:
            route.close()
    n_bytes = sum(2 * torch.Size(s).numel() for _, s in shapes)
    med = statistics.median(times)
    out = {
        "shape": shape, "params": sum(torch.Size(s).numel() for _, s in shapes),
        "tensors": len(shapes), "bytes_bf16": n_bytes, "buckets": len(plan),
        "bucket_bytes": ctx.bucket_bytes,
        "transport": "cuda_ipc" if ctx.cuda else "shared_memory",
        "route": "full_tensor from FSDP2 shards -> bf16 cast in pack -> pipe -> copy into model",
        "receiver_start_s": round(started, 3), "warmup_s": round(warm, 4),
        "hand_over_s": [round(t, 4) for t in times], "median_s": round(med, 4),
        "gb_per_s": round(n_bytes / 1e9 / med, 3), "equal": not bad,
    }  # fmt: skip
    if bad:
        out.update(ok=False, error=f"{len(bad)} tensors differ after the hand-over, e.g. {bad[0]}")
    return out
