"""``init_checkpoint``: a randomly initialised Qwen3 (dense or MoE) plus a locally trained
tokenizer.

The result is a standard transformers checkpoint directory (``config.json``,
``model.safetensors``, ``tokenizer.json``, ...) that ``AutoModelForCausalLM`` and
``AutoTokenizer`` load with no hub, and vLLM can serve; ``gyre.json`` records how it was made.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers

from gyre_core import __version__
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer

MANIFEST = "gyre.json"
NOT_EMPTY = "directory is not empty (pass overwrite=True or --overwrite)"


def init_checkpoint(
    out_dir: str | Path,
    shape: ModelShape | None = None,
    *,
    seed: int = 0,
    corpus: Sequence[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a fresh checkpoint of ``shape`` (default: ``ModelShape()``) to ``out_dir`` and
    return its path.

    The tokenizer is trained on ``corpus`` (default: :func:`default_corpus`) to
    ``shape.vocab_size``; its vocab may come out smaller when the corpus is too small to
    fill it, and the model's vocab is the tokenizer's. ``shape.tie_embeddings`` shares the
    input embedding with the output head (a copy of a context token is then one circuit for
    every token, which a tiny model learns far sooner). The same arguments give
    byte-identical files.
    """
    shape = shape or ModelShape()
    out = Path(out_dir)
    _check_dir(out, overwrite)  # before any work; nothing is touched until the model exists
    texts = list(default_corpus() if corpus is None else corpus)
    hf_tok = as_hf_tokenizer(train_tokenizer(texts, shape.vocab_size))
    hf_tok.model_max_length = shape.max_positions
    arch = {f.name: int(getattr(shape, f.name)) for f in fields(shape) if f.name != "vocab_size"}
    config = tiny_qwen3_config(replace(shape, vocab_size=len(hf_tok)))
    config.bos_token_id = hf_tok.bos_token_id
    config.eos_token_id = hf_tok.eos_token_id
    config.pad_token_id = hf_tok.pad_token_id
    model = build_model(config, seed=seed)
    model.generation_config.bos_token_id = hf_tok.bos_token_id
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    _prepare_dir(out, overwrite)
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    manifest = _manifest(texts, corpus is None, shape.vocab_size, len(hf_tok), seed, arch)
    manifest["model"]["architecture"] = shape.architecture
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


def _check_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out}: {NOT_EMPTY}")


def _prepare_dir(out: Path, overwrite: bool) -> None:
    _check_dir(out, overwrite)
    if out.is_dir() and any(out.iterdir()):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _manifest(
    texts: list[str],
    is_default: bool,
    requested_vocab: int,
    vocab: int,
    seed: int,
    arch: dict[str, int],
) -> dict[str, Any]:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return {
        "format": "gyre.checkpoint/v1",
        "made_by": f"gyre {__version__} init_checkpoint",
        "model": {"architecture": "Qwen3ForCausalLM", "seed": seed, **arch},
        "tokenizer": {
            "kind": "byte-level BPE",
            "requested_vocab_size": requested_vocab,
            "vocab_size": vocab,
        },
        "corpus": {
            "source": "default_corpus()" if is_default else "given",
            "documents": len(texts),
            "chars": sum(len(t) for t in texts),
            "sha256": digest.hexdigest(),
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
