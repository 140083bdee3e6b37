"""The weight hand-over of a colocated trainer and inference engine on one device.

The trainer (this process) holds a Qwen3-shaped model's weights in bf16 (random values;
the names and shapes come from ``benchmarks/gpu_suite_common.py``'s ``SHAPES``, no model is built).
The engine is a child process (``torch.multiprocessing``, spawn) that preallocates the same
tensors on the same device. A hand-over sends every weight in buckets laid out by
``gyre_core/rollout/vllm_ext/gyre_weights.py``: the sender packs a bucket into one flat
uint8 buffer on the device (``pack``) and sends it through a pipe (a CUDA IPC handle on a
GPU, the shared-memory file on the CPU: torch's own reductions); the receiver copies the
views (``unpack``) into its tensors and acknowledges. Two buffers alternate, so packing
bucket k+1 overlaps the receiver's copy of bucket k.

Printed: the model's parameters and bytes, the bucket count, the seconds of each full
hand-over after a warm-up one (which maps the IPC handles) and their median in s and s/GB,
the seconds of the packing alone, whether the receiver's tensors equal the sender's
("equal: yes", else exit code 1) and, on CUDA, whether the median meets the target of a
1.7B-parameter bf16 state in under 2 s. Sizes are decimal: 1 MB = 1e6 bytes, 1 GB = 1e9.

    python benchmarks/gpu_weight_handover.py --shape 1.7b   # on a GPU (CUDA if present)
    python benchmarks/gpu_weight_handover.py --quick        # a tiny shape on the CPU (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_core.rollout.vllm_ext.gyre_weights import Entry, bucket_bytes, pack, plan_buckets, unpack

TARGET_S = 2.0  # the target on a GPU: a 1.7B-parameter bf16 state in under 2 s
Shapes = list[tuple[str, tuple[int, ...]]]


class HandoverError(RuntimeError):
    """The receiver died, failed, or did not answer in time."""


def qwen3_shapes(shape: dict[str, int], vocab: int, tied: bool) -> Shapes:
    """The parameter names and shapes of a Qwen3 decoder of ``shape`` (a ``SHAPES`` entry)."""
    h, d, inter = shape["hidden"], shape["head_dim"], shape["intermediate"]
    q, kv = shape["heads"] * d, shape["kv_heads"] * d
    out: Shapes = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (d,)),
            (p + "self_attn.k_norm.weight", (d,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not tied:
        out.append(("lm_head.weight", (vocab, h)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checksums(tensors: dict[str, torch.Tensor], samples: int = 16) -> dict[str, list[int]]:
    """Per tensor: the exact int64 sum of its bf16 bit patterns, then the bit patterns of
    ``samples`` elements spread evenly over it (so a misplaced block shows too)."""
    out = {}
    for name, t in tensors.items():
        bits = t.reshape(-1).view(torch.int16)
        n, k = bits.numel(), min(samples, bits.numel())
        idx = torch.tensor([j * (n - 1) // max(k - 1, 1) for j in range(k)], device=t.device)
        out[name] = [int(bits.sum(dtype=torch.int64)), *bits[idx].tolist()]
    return out


def receiver(shapes: Shapes, device_name: str, conn: Connection, fail_at: int) -> None:
    """The engine's side: preallocate the tensors, then copy each bucket sent into them
    and acknowledge it; answer ``checksums``; end at ``stop``."""
    try:
        device = torch.device(device_name)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        params = {n: torch.zeros(s, dtype=torch.bfloat16, device=device) for n, s in shapes}
        held: dict[int, torch.Tensor] = {}  # the last buffer of each slot: keeps its mapping
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "bucket":
                _, k, slot, buf, wire = msg
                if k == fail_at:
                    sys.stderr.write(f"receiver: exiting abruptly at bucket {k} (--fail-at)\n")
                    sys.stderr.flush()
                    os._exit(3)
                held[slot] = buf
                for name, view in unpack(buf, [Entry.from_wire(w) for w in wire]):
                    params[name].copy_(view, non_blocking=True)
                _sync(device)  # the copies are done: the sender may refill this buffer
                conn.send(("ack", k))
            elif msg[0] == "checksums":
                conn.send(("checksums", checksums(params)))
            else:  # "stop"
                return
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


class Sender:
    """The trainer's side: the state, two device buffers, the pipe to the receiver."""

    def __init__(self, state: dict[str, torch.Tensor], plan: list[list[Entry]],
                 device: torch.device, timeout: float) -> None:  # fmt: skip
        self.state, self.plan, self.device, self.timeout = state, plan, device, timeout
        size = max(bucket_bytes(b) for b in plan)
        self.bufs = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
        if device.type == "cpu":  # shared memory once, not moved there at the first send
            self.bufs = [b.share_memory_() for b in self.bufs]  # type: ignore[no-untyped-call]
        self.wires = [[e.to_wire() for e in b] for b in plan]
        self.conn: Connection | None = None
        self.child: Any = None

    def start(self, shapes: Shapes, fail_at: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.child = ctx.Process(
            target=receiver, args=(shapes, str(self.device), child_conn, fail_at), daemon=True
        )
        self.child.start()
        child_conn.close()
        self.expect("ready")

    def expect(self, kind: str) -> tuple[Any, ...]:
        """The receiver's next message, which must be ``kind``; polls so that a dead
        receiver or a timeout raises :class:`HandoverError` instead of hanging."""
        assert self.conn is not None
        deadline = time.monotonic() + self.timeout
        while not self.conn.poll(0.5):
            if not self.child.is_alive():
                raise HandoverError(self._died(kind))
            if time.monotonic() > deadline:
                raise HandoverError(f"no {kind!r} from the receiver within {self.timeout:g} s")
        try:
            msg: tuple[Any, ...] = self.conn.recv()
        except (EOFError, OSError):  # the receiver's end closed: it died
            raise HandoverError(self._died(kind)) from None
        if msg[0] == "error":
            raise HandoverError(f"the receiver failed:\n{msg[1]}")
        if msg[0] != kind:
            raise HandoverError(f"expected {kind!r} from the receiver, got {msg[0]!r}")
        return msg

    def _died(self, kind: str) -> str:
        self.child.join(5)
        return (
            f"the receiver died (exit code {self.child.exitcode}) while the sender awaited {kind!r}"
        )

    def send(self, msg: tuple[Any, ...]) -> None:
        assert self.conn is not None
        try:
            self.conn.send(msg)
        except OSError:  # a broken pipe: the receiver died
            raise HandoverError(self._died("a send")) from None

    def hand_over(self) -> float:
        """Send every bucket; the seconds until the receiver acknowledged the last."""
        sent: deque[int] = deque()  # buckets sent, not yet acknowledged, in order
        _sync(self.device)
        t0 = time.perf_counter()
        for k, bucket in enumerate(self.plan):
            slot = k % 2
            while sent and sent[0] <= k - 2:  # bucket k-2 used this buffer: wait for its ack
                self._ack(sent.popleft())
            pack(self.state, bucket, self.bufs[slot])
            _sync(self.device)  # packed before the receiver reads it
            self.send(("bucket", k, slot, self.bufs[slot], self.wires[k]))
            sent.append(k)
        while sent:
            self._ack(sent.popleft())
        return time.perf_counter() - t0

    def _ack(self, k: int) -> None:
        got = self.expect("ack")[1]
        if got != k:
            raise HandoverError(f"acknowledgement for bucket {got}, expected {k}")

    def pack_only(self) -> float:
        """The seconds to pack every bucket (alternating buffers), nothing sent."""
        _sync(self.device)
        t0 = time.perf_counter()
        for k, bucket in enumerate(self.plan):
            pack(self.state, bucket, self.bufs[k % 2])
        _sync(self.device)
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop the receiver (terminate it if it does not end)."""
        if self.child is None:
            return
        if self.child.is_alive():
            with contextlib.suppress(HandoverError):  # it may die meanwhile
                self.send(("stop",))
            self.child.join(30)
        if self.child.is_alive():
            self.child.terminate()
            self.child.join(5)


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _size(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.2f} MB"


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: the receiver re-imports this file (spawn) and so
    # skips gpu_suite_common's imports (transformers).
    from benchmarks.gpu_suite_common import SHAPES

    if args.shape not in SHAPES:
        print(f"error: --shape must be one of {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    shapes = qwen3_shapes(SHAPES[args.shape], args.vocab, args.tied)
    n_params = sum(torch.Size(s).numel() for _, s in shapes)
    n_bytes = 2 * n_params
    gb = n_bytes / 1e9
    plan = plan_buckets(shapes, "bfloat16", int(args.bucket_mb * 1e6))
    print(f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))  # fmt: skip
    print(f"model {args.shape}: {_count(n_params)} parameters ({n_params:,}), "
          f"{_size(n_bytes)} in bf16 ({n_bytes:,} bytes), {len(shapes)} tensors, "
          f"vocab {args.vocab}, lm_head {'tied' if args.tied else 'untied'}")  # fmt: skip
    largest = max(bucket_bytes(b) for b in plan)
    print(f"{len(plan)} buckets of at most {args.bucket_mb:g} MB "
          f"(largest {_size(largest)}), 2 buffers on {device}")  # fmt: skip

    state = {n: torch.randn(s, dtype=torch.bfloat16, device=device) for n, s in shapes}
    sender = Sender(state, plan, device, args.timeout)
    try:
        t0 = time.perf_counter()
        sender.start(shapes, args.fail_at)
        print(f"receiver started: {time.perf_counter() - t0:.2f} s")
        print(f"warm-up hand-over: {sender.hand_over():.3f} s")
        times = []
        for r in range(args.repeats):
            for t in state.values():  # new values (exact) so the last hand-over is checked
                t.neg_()
            times.append(sender.hand_over())
            print(f"hand-over {r + 1}: {times[-1]:.3f} s ({times[-1] / gb:.3g} s/GB)")
        packs = [sender.pack_only() for _ in range(args.repeats)]
        sender.send(("checksums",))
        theirs = sender.expect("checksums")[1]
    except HandoverError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        sender.close()

    med, med_pack = statistics.median(times), statistics.median(packs)
    print(f"pack alone: median {med_pack:.3g} s ({med_pack / gb:.3g} s/GB)")
    print(f"hand-over {args.shape} ({_count(n_params)} params, {_size(n_bytes)} bf16), "
          f"bucket {args.bucket_mb:g} MB, {device.type}: median {med:.3g} s ({med / gb:.3g} s/GB)")  # fmt: skip
    bad = [n for n, c in checksums(state).items() if theirs.get(n) != c]
    if bad:
        print(f"equal: NO ({len(bad)} of {len(state)} tensors differ, e.g. {bad[0]})")
        return 1
    print("equal: yes")
    if device.type == "cuda":
        print(f"target < {TARGET_S:g} s: {'met' if med < TARGET_S else 'not met'}")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the tiny shape, vocab 4096, 0.25 MB buckets, on the CPU (overrides those options)",
    )
    ap.add_argument("--shape", default="1.7b", help="a key of gpu_suite_common.SHAPES")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--tied", action="store_true", help="no lm_head (tied to the embeddings)")
    ap.add_argument("--bucket-mb", type=float, default=512.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda if present)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to await a reply")
    ap.add_argument("--fail-at", type=int, default=-1, help="(testing) receiver dies at bucket")
    args = ap.parse_args()
    if args.quick:
        args.shape, args.vocab, args.bucket_mb, args.device = "tiny", 4096, 0.25, "cpu"
    sys.exit(run(args))


if __name__ == "__main__":
    main()
