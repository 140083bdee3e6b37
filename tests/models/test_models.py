"""Local tokenizers and checkpoints: exact round-trips, offline loading, determinism, CLI."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from gyre_core.models.init import MANIFEST, init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.models.tokenizer import (
    MIN_VOCAB,
    SPECIAL_TOKENS,
    as_hf_tokenizer,
    default_corpus,
    train_tokenizer,
)
from tests.gyre_cli import gyre

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing below may reach a hub

TINY = ModelShape(
    vocab_size=512, layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128
)
TINY_CLI = ("--vocab-size", "512", "--layers", "1", "--hidden", "64", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "32", "--intermediate", "128")  # fmt: skip
AWKWARD = [
    "",
    " ",
    "  leading and trailing  ",
    "héllo wörld — ünïcödé",
    "emoji 🎉👩‍👩‍👧 flags 🇫🇷",
    "\x00\x01\x1b[31mred\x1b[0m\r\n\t\x7f",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|><|endoftext|>",
    "<|im_start",
    "\U0010ffff\ufeff\u200b",
    "def f(x):\n    return {'a': [1, 2.5e-3]}\n",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(default_corpus(), vocab_size=512)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_checkpoint(tmp_path_factory.mktemp("ckpt") / "model", TINY)


@pytest.fixture(scope="module")
def auto_tok(ckpt: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(ckpt, local_files_only=True)


# -- tokenizer ---------------------------------------------------------------------------


def test_vocab_has_bytes_and_specials_first(tok: Tokenizer) -> None:
    assert tok.get_vocab_size() == 512
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i
    vocab = tok.get_vocab()
    byte_symbols = [t for t in vocab if len(t) == 1 and t not in SPECIAL_TOKENS]
    assert len(byte_symbols) == 256


def test_too_small_vocab_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=MIN_VOCAB - 1)


def test_default_corpus_is_deterministic_and_small() -> None:
    corpus = default_corpus()
    assert corpus == default_corpus()
    assert 10_000 < sum(len(t.encode()) for t in corpus) < 500_000


def test_default_vocab_is_filled() -> None:
    assert train_tokenizer(default_corpus()).get_vocab_size() == 4096


@pytest.mark.parametrize("text", AWKWARD)
def test_awkward_strings_round_trip(
    tok: Tokenizer, auto_tok: PreTrainedTokenizerBase, text: str
) -> None:
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    ids = auto_tok(text, add_special_tokens=False)["input_ids"]
    assert auto_tok.decode(ids) == text


def test_special_tokens_encode_as_one_id(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\n<|tool|>x<|im_end|>").ids
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.token_to_id("<|tool|>") in ids
    assert ids[-1] == tok.token_to_id("<|im_end|>")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips_through_saved_autotokenizer(
    auto_tok: PreTrainedTokenizerBase, text: str
) -> None:
    ids = auto_tok(text, add_special_tokens=False)["input_ids"]
    assert auto_tok.decode(ids) == text


def test_hf_wrapper_sets_bos_eos_pad(tok: Tokenizer) -> None:
    hf = as_hf_tokenizer(tok)
    assert hf.bos_token_id == hf.eos_token_id == tok.token_to_id("<|endoftext|>")
    assert hf.pad_token_id == tok.token_to_id("<|pad|>")
    chat = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"


# -- checkpoint --------------------------------------------------------------------------


def test_checkpoint_loads_offline_and_runs(ckpt: Path, auto_tok: PreTrainedTokenizerBase) -> None:
    model = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(auto_tok) == 512
    assert model.config.eos_token_id == auto_tok.eos_token_id
    assert model.config.pad_token_id == auto_tok.pad_token_id
    assert model.config.head_dim >= 32
    ids = auto_tok("def f(x): return x + 1  # 🎉", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(auto_tok))
    assert torch.isfinite(logits).all()


def test_checkpoint_files_and_manifest(ckpt: Path) -> None:
    names = {p.name for p in ckpt.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MANIFEST} <= names
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["tokenizer"]["vocab_size"] == 512
    assert manifest["corpus"]["source"] == "default_corpus()"
    assert manifest["model"]["layers"] == 1


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_same_seed_same_files_other_seed_other_weights(ckpt: Path, tmp_path: Path) -> None:
    again = init_checkpoint(tmp_path / "again", TINY)
    assert _digests(again) == _digests(ckpt)
    other = _digests(init_checkpoint(tmp_path / "other", TINY, seed=1))
    assert other["model.safetensors"] != _digests(ckpt)["model.safetensors"]
    assert other["tokenizer.json"] == _digests(ckpt)["tokenizer.json"]


def test_custom_corpus_and_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "c"
    init_checkpoint(out, TINY, corpus=["tiny corpus"] * 3)
    with pytest.raises(ValueError, match="not empty"):
        init_checkpoint(out, TINY)
    init_checkpoint(out, TINY, overwrite=True)
    assert json.loads((out / MANIFEST).read_text())["corpus"]["source"] == "default_corpus()"


# -- CLI ---------------------------------------------------------------------------------


def test_cli_init_then_refuses_non_empty_dir(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("print('hello')\n" * 50 + "ünïcödé 🎉\n", encoding="utf-8")
    out = tmp_path / "m"
    done = gyre("model", "init", "--out", str(out), "--corpus", str(corpus), "--json", *TINY_CLI)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["out"] == str(out) and summary["vocab_size"] <= 512
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert len(tok) == summary["vocab_size"]

    again = gyre("model", "init", "--out", str(out), *TINY_CLI)
    assert again.returncode == 2
    assert again.stdout == ""
    assert again.stderr.startswith("gyre: ") and again.stderr.count("\n") == 1
    assert "not empty" in again.stderr


def test_the_cli_flags_are_the_model_shape_with_its_defaults(tmp_path):
    from dataclasses import asdict, fields

    from gyre_core.cli.main import build_parser

    args = build_parser().parse_args(["model", "init", "--out", str(tmp_path)])
    assert {f.name: getattr(args, f.name) for f in fields(ModelShape)} == asdict(ModelShape())
    args = build_parser().parse_args(["model", "init", "--out", "x", "--tie-embeddings", *TINY_CLI])
    shape = ModelShape(**{f.name: getattr(args, f.name) for f in fields(ModelShape)})
    assert shape == replace(TINY, tie_embeddings=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"head_dim": 16}, "head_dim must be >= 32"), ({"kv_heads": 3}, "multiple of kv_heads")],
)
def test_a_shape_the_models_cannot_take_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TINY, **change)


def test_the_cli_takes_a_mixture_of_experts_and_refuses_a_bad_one(tmp_path):
    from gyre_core.cli.main import build_parser

    parse = build_parser().parse_args
    args = parse(["model", "init", "--out", "x", "--experts", "8", "--experts-per-token", "2"])
    assert (args.experts, args.experts_per_token) == (8, 2)
    assert parse(["model", "init", "--out", "x", "--experts", "0"]).experts == 0  # dense
    bad = gyre("model", "init", "--out", str(tmp_path / "m"), "--experts", "2",
               "--experts-per-token", "3")  # fmt: skip
    assert bad.returncode == 2 and "experts_per_token must be between 1 and experts" in bad.stderr
    assert gyre("model", "init", "--out", "x", "--experts", "-1").returncode == 2
