"""The bucket layout of a weight update (``gyre_weights``) and the CPU sender
(``ShmSender``) against a receiver in this process that does what the vLLM worker
extension does: map the shared-memory file, view each tensor, copy it into a model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from gyre_core.rollout.vllm_ext.gyre_weights import (
    ALIGN,
    Entry,
    bucket_bytes,
    group_of,
    pack,
    plan_buckets,
    unpack,
)
from gyre_core.rollout.weight_sync import ShmSender, of_chunks, of_state, plan


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"embed": (100, 16), "a.q": (16, 16), "a.norm": (16,), "big": (300, 64), "b.k": (3, 5)}
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_buckets_are_bounded_aligned_and_in_order() -> None:
    state = _state()
    buckets = plan(state, "float32", 4096)
    assert [e.name for b in buckets for e in b] == list(state)  # every tensor once, in order
    for b in buckets:
        assert all(e.offset % ALIGN == 0 for e in b)
        assert bucket_bytes(b) <= 4096 or len(b) == 1  # only a lone tensor may be larger
        ends = [e.offset + e.nbytes for e in b]
        assert all(end <= nxt.offset for end, nxt in zip(ends, b[1:], strict=False))
    assert [[e.name for e in b] for b in buckets] == [
        ["embed"],
        ["a.q", "a.norm"],
        ["big"],
        ["b.k"],
    ]
    e = buckets[0][0]
    assert Entry.from_wire(json.loads(json.dumps(e.to_wire()))) == e
    with pytest.raises(ValueError, match="dtype"):
        plan_buckets([("x", (2,))], "int8", 64)
    with pytest.raises(ValueError, match="dtype"):
        Entry.from_wire(["x", "int64", [2], 0])
    with pytest.raises(ValueError, match="outside"):
        list(unpack(torch.zeros(8, dtype=torch.uint8), [Entry("x", "float32", (4,), 0)]))


def test_a_decoder_layer_or_module_is_never_split() -> None:
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight",
             "model.layers.1.input_layernorm.weight", "model.norm.weight", "lm_head.weight"]  # fmt: skip
    assert group_of(names[1]) == group_of(names[2]) == "model.layers.0"
    assert group_of(names[0]) == "model.embed_tokens" and group_of(names[-1]) == "lm_head"
    buckets = plan_buckets(((n, (16, 16)) for n in names), "float32", 1500)  # 1 kB a tensor
    assert [[e.name for e in b] for b in buckets] == [
        names[:1],
        names[1:3],
        names[3:5],
        names[5:6],
        names[6:],
    ]  # a layer's two tensors (2 kB) are larger than a bucket: together all the same


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pack_then_unpack_gives_the_tensors_in_the_served_dtype(dtype: str) -> None:
    state = _state()
    for bucket in plan(state, dtype, 2048):
        buf = torch.zeros(bucket_bytes(bucket), dtype=torch.uint8)
        pack(state, bucket, buf)
        for name, t in unpack(buf, bucket):
            want = state[name].to(t.dtype)
            assert str(t.dtype) == f"torch.{dtype}" and torch.equal(t, want)


def test_the_shm_sender_pipelines_buckets_through_two_files() -> None:
    state = _state()
    buckets = plan(state, "float32", 4096)
    got: dict[str, torch.Tensor] = {}
    calls: list[str] = []

    async def worker(path: str, body: Any) -> None:  # what gyre_vllm_ext does, in process
        assert path == "/collective_rpc"
        calls.append(body["method"])
        if body["method"] == "gyre_load_bucket":
            spec = json.loads(body["args"][0])
            buf = torch.from_file(spec["path"], shared=True, size=spec["size"], dtype=torch.uint8)
            bucket = [Entry.from_wire(x) for x in spec["entries"]]
            await asyncio.sleep(0.01)  # the next bucket is packed meanwhile, in the other file
            got.update({k: v.clone() for k, v in unpack(buf, bucket)})

    sender = ShmSender()
    try:
        asyncio.run(sender.send(of_state(state, buckets), worker))
        assert sorted(p.name for p in sender.folder.iterdir()) == ["bucket-0", "bucket-1"]
        changed = {k: v + 1 for k, v in state.items()}  # a second update reuses the files
        asyncio.run(sender.send(of_state(changed, buckets), worker))
    finally:
        sender.close()
    assert calls[0] == "gyre_begin_update" and calls[-1] == "gyre_end_update"
    assert calls.count("gyre_load_bucket") == 2 * len(buckets) > 4
    assert all(torch.equal(got[k], v) for k, v in changed.items())
    assert not sender.folder.exists()

    # A state arriving in chunks (the training group's buckets) is planned chunk by chunk.
    async def chunks() -> AsyncIterator[dict[str, torch.Tensor]]:
        names = list(state)
        for part in (names[:2], names[2:]):
            yield {k: state[k] * 3 for k in part}

    calls.clear()
    sender = ShmSender()
    try:
        sent = asyncio.run(sender.send(of_chunks(chunks(), "bfloat16", 4096), worker))
    finally:
        sender.close()
    assert sent == sum(v.numel() * 2 for v in state.values())  # bf16
    assert all(torch.equal(got[k], (v * 3).to(torch.bfloat16)) for k, v in state.items())
