"""vLLM's weight-transfer routes on a CPU. The NCCL route (``nccl_sync``,
``train/weight_out``): the trainer's side here as rank 0, two engines each a process of the
vllm venv that checks every body with vLLM's own classes and receives as vLLM's receiver
does, over gloo standing in for NCCL (``nccl_receiver.py``). The bodies both CUDA senders
post (NCCL, IPC), checked by vLLM 0.32's own info classes, which the server builds from
them before anything else. Skipped without the vllm venv (``GYRE_REQUIRE_VLLM=1`` fails
instead)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from gyre_core.rollout import vllm_env
from gyre_core.rollout.nccl_sync import (
    NcclGroup,
    Plan,
    layout,
    nccl_init_body,
    nccl_update_body,
    receive,
)
from gyre_core.rollout.vllm_engine import VLLMEngine, VLLMEngineError
from gyre_core.rollout.vllm_ext.gyre_weights import Entry
from gyre_core.rollout.weight_sync import (
    CudaIpcSender,
    handle_maps,
    ipc_init_body,
    ipc_update_body,
    uuids_of,
)
from gyre_core.train.weight_out import WeightOut, specs, tied_names

HERE = Path(__file__).resolve().parent


def _vllm_python() -> str:
    if vllm_env.is_ready(vllm_env.DEFAULT_VENV):
        return str(vllm_env.venv_python(vllm_env.DEFAULT_VENV))
    reason = f"no vllm venv ready at {vllm_env.DEFAULT_VENV}"
    if os.environ.get("GYRE_REQUIRE_VLLM") == "1":
        pytest.fail(f"GYRE_REQUIRE_VLLM=1 but {reason}")
    pytest.skip(reason)


def _model(tied: bool) -> Any:
    torch.manual_seed(3)
    config = Qwen3Config(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, intermediate_size=128,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return Qwen3ForCausalLM(config)


def test_the_plan_sends_a_tied_weight_once_and_keeps_the_state_order() -> None:
    model = _model(tied=True)
    assert "lm_head.weight" in model.state_dict()  # the state dict holds it twice
    assert tied_names(model) == {"lm_head.weight"}
    names = [n for n, _, _ in specs(model, "bfloat16")]
    assert names == [n for n in model.state_dict() if n != "lm_head.weight"]
    plan = Plan.of(specs(model, "bfloat16"), 40_000)
    assert [n for b in plan.buckets for n, _, _ in b] == names
    assert Plan.from_wire(json.loads(json.dumps(plan.to_wire()))) == plan
    assert all(
        len({n.split(".")[2] for n, _, _ in b if ".layers." in n}) <= 1 for b in plan.buckets
    )
    untied = _model(tied=False)
    assert tied_names(untied) == set()
    assert layout([1, 2, 4]) == ([1, 2, 4], 8)


def _receivers(
    n: int, store_port: int, tmp_path: Path
) -> list[tuple[subprocess.Popen[str], str, Path]]:
    py = _vllm_python()
    out = []
    for i in range(n):
        path = tmp_path / f"engine{i}.safetensors"
        proc = subprocess.Popen(
            [py, str(HERE / "nccl_receiver.py"), str(store_port), str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        out.append((proc, f"http://127.0.0.1:{proc.stdout.readline().strip()}", path))
    return out


def test_buckets_broadcast_over_gloo_reach_every_engine_byte_identical(tmp_path: Path) -> None:
    model = _model(tied=True)
    with torch.no_grad():  # a trained step: weights other than the checkpoint's
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = WeightOut(model, torch.device("cpu"), rank=0)
    plan = out.plan("bfloat16", 40_000)
    offsets, world = layout([1, 1])
    port = out.open(world)
    engines = _receivers(2, int(port), tmp_path)
    try:
        clients = [VLLMEngine(url) for _, url, _ in engines]
        uid = bytes(range(128))  # gloo's rendezvous is the store; the body is NCCL's
        inits = [nccl_init_body(uid, o, world) for o in offsets]
        sent: list[int] = []
        sender = threading.Thread(target=lambda: sent.append(out.send(plan)))
        sender.start()

        async def both(version: int, init: list[Any]) -> None:
            await asyncio.gather(
                *(receive(c, plan, version, i) for c, i in zip(clients, init, strict=True))
            )

        asyncio.run(both(7, inits))
        sender.join(60)
        assert sent == [plan.nbytes]
        state = model.state_dict()
        for _, _, path in engines:
            got = load_file(str(path))
            assert sorted(got) == sorted(n for b in plan.buckets for n, _, _ in b)
            assert "lm_head.weight" not in got  # tied: sent once, as the embedding
            for name, t in got.items():
                assert t.dtype == torch.bfloat16
                assert torch.equal(t, state[name].to(torch.bfloat16)), name
        for c in clients:
            assert asyncio.run(c.weight_version()) == "7"
        # the next update reuses the group: no init
        sender = threading.Thread(target=lambda: sent.append(out.send(plan)))
        sender.start()
        asyncio.run(both(8, [None, None]))
        sender.join(60)
        assert sent[-1] == plan.nbytes
    finally:
        out.close()
        for proc, url, _ in engines:
            with contextlib.suppress(OSError, VLLMEngineError):
                asyncio.run(VLLMEngine(url).post("/shutdown", {}))
            proc.wait(30)


_CHECK = """
import json, sys
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
from vllm.distributed.weight_transfer.ipc_engine import (
    IPCWeightTransferInitInfo, IPCWeightTransferUpdateInfo)
kinds = {"nccl_init": NCCLWeightTransferInitInfo, "nccl_update": NCCLWeightTransferUpdateInfo,
         "ipc_init": IPCWeightTransferInitInfo, "ipc_update": IPCWeightTransferUpdateInfo}
out = []
for kind, body in json.load(sys.stdin):
    try:
        info = kinds[kind](**body)
        handles = getattr(info, "ipc_handles", None)
        out.append(["ok", [sorted(h) for h in handles] if handles else None])
    except (TypeError, ValueError) as e:
        out.append(["refused", str(e)])
print(json.dumps(out))
"""


def vllm_verdicts(bodies: list[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
    """What vLLM 0.32's own info classes make of each ``(kind, info)``: ``["ok", the uuids
    of each IPC handle map]`` or ``["refused", why]`` (the server answers an error)."""
    env = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    done = subprocess.run(
        [_vllm_python(), "-c", _CHECK],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_bodies_of_both_cuda_routes_pass_vllms_validation_and_stray_fields_do_not() -> None:
    uid = bytes(range(128))
    init = nccl_init_body(uid, 1, 3)["init_info"]
    update = nccl_update_body([("a.weight", "bfloat16", (2, 3)), ("b.bias", "float32", (3,))])
    bucket = [Entry("a.weight", "bfloat16", (2, 3), 0), Entry("b.bias", "float32", (3,), 64)]
    uuids = ["1b7c1a4e-0000-4000-8000-000000000001", "1b7c1a4e-0000-4000-8000-000000000002"]
    # rebuild_cuda_tensor's arguments cannot be made without a GPU; their place in the
    # body (one tuple per uuid per tensor) is what vLLM checks and looks up
    maps = handle_maps([("args-of", "a.weight"), ("args-of", "b.bias")], uuids)
    ipc_update = ipc_update_body(bucket, maps)["update_info"]
    verdicts = vllm_verdicts(
        [
            ("nccl_init", init),
            ("nccl_update", update["update_info"]),
            ("ipc_init", ipc_init_body()["init_info"]),
            ("ipc_update", ipc_update),
            ("nccl_update", {**update["update_info"], "packed": False}),  # an older vLLM's
            ("nccl_init", {**init, "master_address": "127.0.0.1", "master_port": 1}),
            ("ipc_init", {"packed": False, "bucketed": True}),
            ("ipc_update", {**ipc_update, "ipc_handles": maps}),  # both forms at once
        ]
    )
    assert verdicts[:3] == [["ok", None], ["ok", None], ["ok", None]]
    assert verdicts[3] == ["ok", [sorted(uuids), sorted(uuids)]]  # each worker finds its own
    assert [v[0] for v in verdicts[4:]] == ["refused"] * 4
    assert "packed" in verdicts[4][1] and "OR master_address" in verdicts[5][1]
    with pytest.raises(ValueError, match="2 handles"):
        ipc_update_body(bucket + bucket, maps)
    with pytest.raises(RuntimeError, match="CUDA"):
        CudaIpcSender(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="CUDA"):
        NcclGroup(torch.device("cpu"))
    smi = f"0, GPU-{uuids[0]}\n1, GPU-{uuids[1]}\n"  # nvidia-smi's form: torch prints no GPU-
    assert uuids_of(smi, [1, 0]) == [uuids[1], uuids[0]]
    with pytest.raises(RuntimeError, match="no GPU"):
        uuids_of(smi, [2])
