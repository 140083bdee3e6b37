"""A byte-level BPE tokenizer trained locally: any text round-trips, no hub needed.

The pre-tokenizer cuts text as Qwen's does (``PRE_TOKENIZE``), then maps every byte to one
of 256 printable symbols; the decoder maps them back, so ``decode(encode(x)) == x`` for
every string (decode with ``skip_special_tokens=False`` when ``x`` may spell a special
token). No normaliser runs and no prefix space is added, so nothing is changed on the way
in.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL = "<|tool|>"
SPECIAL_TOKENS = (ENDOFTEXT, PAD, IM_START, IM_END, TOOL)
BYTE_SYMBOLS = 256
MIN_VOCAB = BYTE_SYMBOLS + len(SPECIAL_TOKENS)

# How text is cut before BPE merges, as Qwen2/3's tokenizer cuts it (numbers in runs of up
# to 3 digits, as Llama 3's): a word keeps one leading non-letter, so ``/payments`` and
# ``.json`` can each become one token, as they are in Qwen's vocabulary. (GPT-2's pattern
# splits every punctuation mark from the word after it: a path's extension is then a token
# after ".", which a tiny model must copy by looking two tokens back; docs/learning.md.)
PRE_TOKENIZE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE on ``texts``; ids 0..4 are the special tokens, in order."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be >= {MIN_VOCAB} (256 bytes + specials)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def as_hf_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap ``tok`` for transformers: bos/eos ``<|endoftext|>``, pad ``<|pad|>``, ChatML."""
    # transformers leaves this constructor unannotated.
    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END, TOOL],
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def default_corpus(seed: int = 0, docs: int = 1000) -> list[str]:
    """A small deterministic corpus of spec-, code-, JSON- and shell-like text (~300 KB)."""
    rng = random.Random(seed)
    makers = (_python_snippet, _json_blob, _shell_output, _spec_text, _chat_turn)
    return [makers[i % len(makers)](rng) for i in range(docs)]


_NAMES = (
    "rollout",
    "reward",
    "tokens",
    "branch",
    "prefix",
    "scheduler",
    "unit",
    "trainer",
    "config",
    "path",
    "result",
    "value",
    "index",
    "batch",
    "session",
    "trace",
    "step",
)
_WORDS = (
    "the",
    "agent",
    "must",
    "return",
    "a",
    "list",
    "of",
    "each",
    "tool",
    "call",
    "when",
    "test",
    "fails",
    "file",
    "is",
    "written",
    "to",
    "and",
    "error",
    "with",
    "code",
    "should",
    "raise",
    "if",
    "input",
    "empty",
    "output",
    "in",
    "order",
    "for",
    "every",
    "request",
)


_SYLLABLES = (*(c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"), "str", "ing", "ion")


def _word(rng: random.Random) -> str:
    """A pseudo-word from a fixed syllable set: gives BPE enough variety to fill its vocab."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))


def _name(rng: random.Random) -> str:
    parts = rng.sample(_NAMES, rng.randint(1, 2)) + [_word(rng)] * (rng.random() < 0.5)
    return "_".join(parts)


def _python_snippet(rng: random.Random) -> str:
    fn, arg, other = _name(rng), _name(rng), _name(rng)
    n = rng.randint(0, 99)
    return (
        f"def {fn}({arg}: list[int], {other}: int = {n}) -> int:\n"
        f'    """Return the {rng.choice(_WORDS)} {rng.choice(_WORDS)} of {arg}."""\n'
        f"    total = 0\n"
        f"    for i, x in enumerate({arg}):\n"
        f"        if x > {other}:\n"
        f"            total += x * {rng.randint(1, 9)}\n"
        f"    return total\n\n\n"
        f"assert {fn}([{n}, {n + 1}], {max(n - 1, 0)}) >= 0\n"
    )


def _json_blob(rng: random.Random) -> str:
    obj = {
        "id": f"call_{rng.randrange(16**8):08x}",
        "type": "function",
        "function": {
            "name": _name(rng),
            "arguments": json.dumps(
                {_name(rng): rng.randint(0, 999), "path": f"src/{_name(rng)}.py"}
            ),
        },
        "ok": rng.random() < 0.8,
        "score": round(rng.random(), 3),
    }
    return json.dumps(obj, indent=rng.choice((None, 2)))


def _shell_output(rng: random.Random) -> str:
    passed, failed = rng.randint(0, 200), rng.randint(0, 5)
    mod = _name(rng)
    return (
        f"$ python -m pytest tests/test_{mod}.py -q\n"
        f"{'.' * rng.randint(1, 40)}{'F' * failed}\n"
        f"FAILED tests/test_{mod}.py::test_{_name(rng)} - AssertionError: {rng.randint(0, 9)} != "
        f"{rng.randint(0, 9)}\n"
        f"{failed} failed, {passed} passed in {rng.random() * 10:.2f}s\n"
        f"$ ls -la src/\n"
        f"-rw-r--r--  1 agent agent  {rng.randint(100, 99999)} Jan {rng.randint(1, 28)} "
        f"{mod}.py\n"
        f"$ echo $?\n{int(failed > 0)}\n"
    )


def _prose(rng: random.Random, lo: int, hi: int) -> str:
    pick = (lambda: rng.choice(_WORDS), lambda: _word(rng))
    return " ".join(pick[rng.random() < 0.3]() for _ in range(rng.randint(lo, hi)))


def _spec_text(rng: random.Random) -> str:
    lines = []
    for i in range(rng.randint(2, 5)):
        words = _prose(rng, 6, 14)
        lines.append(f"{i + 1}. {words.capitalize()}.")
    return f"## {_name(rng).replace('_', ' ').title()}\n\n" + "\n".join(lines) + "\n"


def _chat_turn(rng: random.Random) -> str:
    ask = _prose(rng, 4, 10)
    return (
        f"{IM_START}user\n{ask.capitalize()}?{IM_END}\n"
        f"{IM_START}assistant\n{TOOL}{_json_blob(rng)}{IM_END}\n"
        f"{IM_START}tool\n{_shell_output(rng)}{IM_END}\n{ENDOFTEXT}"
    )
