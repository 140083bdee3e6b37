"""``model.chat_template: checkpoint``: a checkpoint's own Jinja chat template renders the
endpoint's calls and imported logs one message at a time, and what is recorded reads back as
exactly the template's rendering of the whole conversation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer
from gyre_core.rollout.chat import ChatError, Message, check_messages, check_tools
from gyre_core.rollout.chat_log import read_demonstrations
from gyre_core.rollout.chat_session import ChatSession
from gyre_core.rollout.chat_template import TemplateFormat, chat_format
from gyre_core.rollout.engine import Completion
from gyre_core.rollout.plugins import PluginError

# Not ChatML's layout: tools in a turn of their own, tool results in a ``tool`` turn, the
# header after the role a colon, an end-of-turn that is a special token.
TEMPLATE = (
    "{%- if tools %}<|im_start|>tools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}:\n"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{%- if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}\n<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant:\n{% endif %}"
)
UNSTABLE = (  # every turn's header counts the whole conversation
    "{% for m in messages %}<|im_start|>{{ m['role'] }} of {{ messages | length }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    tok = as_hf_tokenizer(train_tokenizer(default_corpus(), 600))
    tok.chat_template = TEMPLATE
    return tok


def rendered(hf, raw: list[dict], tools=None, gen: bool = True) -> str:  # type: ignore[no-untyped-def]
    """The template on the OpenAI messages, tool-call arguments as objects (Hugging Face's
    convention for chat templates)."""
    raw = json.loads(json.dumps(raw))
    for m in raw:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return str(hf.apply_chat_template(raw, tools=tools, tokenize=False, add_generation_prompt=gen))


def text(hf, ids: list[int]) -> str:  # type: ignore[no-untyped-def]
    return str(hf.decode(ids, skip_special_tokens=False))


def answer(fmt: TemplateFormat, messages: list[Message], version: int) -> Completion:
    """What a model that writes exactly the template's reply would return."""
    ids = fmt.reply_ids(messages, len(messages) - 1)
    return Completion(ids, [-0.25] * len(ids), [version] * len(ids), "stop")


def test_recorded_calls_read_back_as_the_templates_rendering(hf) -> None:  # type: ignore[no-untyped-def]
    fmt = chat_format(hf, "checkpoint")
    assert isinstance(fmt, TemplateFormat) and fmt.stop_ids() == tuple(
        sorted({hf.convert_tokens_to_ids("<|im_end|>"), hf.eos_token_id})
    )
    chat = ChatSession("s", fmt)
    tools = check_tools(TOOLS)
    raw = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Read a.py"}]
    # call 1: the prompt is the template's rendering, tools and generation cue included
    p1 = chat.prompt(fmt.with_tools(check_messages(raw), tools))
    assert text(hf, p1.ids) == rendered(hf, raw, TOOLS)
    call = {"id": "k", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}  # fmt: skip
    said = {"role": "assistant", "content": "Looking.", "tool_calls": [call]}
    out = answer(fmt, fmt.with_tools(check_messages([*raw, said]), tools), 3)
    c1, _ = chat.reserve()
    content, calls = chat.record(c1, p1, out)
    assert content == "Looking." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("read_file", {"path": "a.py"})
    ]
    # call 2 extends call 1: its tokens are reused, and the whole reads as the template
    raw2 = [*raw, said, {"role": "tool", "tool_call_id": "k", "content": "print(1)"}]
    p2 = chat.prompt(fmt.with_tools(check_messages(raw2), tools))
    assert p2.ids[: len(p1.ids) + len(out.token_ids)] == [*p1.ids, *out.token_ids]
    assert text(hf, p2.ids) == rendered(hf, raw2, TOOLS)
    c2, _ = chat.reserve()
    chat.record(
        c2,
        p2,
        Completion(out.token_ids, [-0.1] * len(out.token_ids), [4] * len(out.token_ids), "stop"),
    )
    assert [c.kind for c in chat.calls] == ["continue", "continue"]
    assert chat.calls[1].prefix is not None and chat.calls[1].prefix.call_id == c1
    # a compaction: the system turn and a summary; shares only the system turn -> a branch
    raw3 = [raw[0], {"role": "user", "content": "Summary: a.py prints 1."}]
    p3 = chat.prompt(fmt.with_tools(check_messages(raw3), tools))
    assert text(hf, p3.ids) == rendered(hf, raw3, TOOLS)
    c3, _ = chat.reserve()
    chat.record(c3, p3, answer(fmt, fmt.with_tools(check_messages([*raw3, said]), tools), 5))
    assert chat.calls[2].kind == "branch" and chat.calls[2].prefix is not None
    # other tools share nothing: a new root
    p4 = chat.prompt(check_messages(raw))
    assert p4.prefix is None and text(hf, p4.ids) == rendered(hf, raw)


def test_a_reply_cut_short_is_closed_by_the_templates_end_of_turn(hf) -> None:  # type: ignore[no-untyped-def]
    fmt = TemplateFormat(hf)
    chat = ChatSession("s", fmt)
    raw = [{"role": "user", "content": "Count"}]
    p1 = chat.prompt(check_messages(raw))
    ids = fmt.codec.encode("one two")  # stopped at max_tokens: no end-of-turn
    c1, _ = chat.reserve()
    chat.record(c1, p1, Completion(ids, [-1.0] * len(ids), [0] * len(ids), "length"))
    raw2 = [*raw, {"role": "assistant", "content": "one two"}, {"role": "user", "content": "go"}]
    p2 = chat.prompt(check_messages(raw2))
    assert p2.prefix is not None and text(hf, p2.ids) == rendered(hf, raw2)


def test_a_template_that_rewrites_earlier_turns_is_refused_by_message(hf) -> None:  # type: ignore[no-untyped-def]
    fmt = TemplateFormat(hf, UNSTABLE)
    chat = ChatSession("s", fmt)
    one = check_messages([{"role": "user", "content": "hi"}])
    assert text(hf, chat.prompt(one).ids).startswith("<|im_start|>user of 1\nhi")
    two = check_messages([{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}])
    with pytest.raises(ChatError) as e:
        chat.prompt(two)
    assert e.value.param == "messages[1]" and "chatml" in e.value.problem


def test_the_config_names_the_field_when_the_tokenizer_has_no_template() -> None:
    bare = as_hf_tokenizer(train_tokenizer(default_corpus(), 600))
    bare.chat_template = None
    with pytest.raises(PluginError) as e:
        chat_format(bare, "checkpoint")
    assert e.value.field == "model.chat_template" and "no chat template" in str(e.value)


def test_a_message_log_without_token_ids_reads_in_the_template(hf, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = [
        {"role": "user", "content": "Read a.py"},
        {"role": "assistant", "content": "It prints 1."},
        {"role": "user", "content": "And b.py?"},
        {"role": "assistant", "content": "Nothing."},
    ]
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"id": "e1", "messages": raw, "reward": 1.0}) + "\n")
    (r,) = read_demonstrations(log, hf, "checkpoint")
    assert [c.kind for c in r.calls] == ["continue", "continue"]
    last = r.calls[-1]
    head = chat_tokens(r, hf)
    assert head.startswith(rendered(hf, raw[:3])) and text(hf, last.completion_ids.tolist()) == (
        "Nothing.<|im_end|>"
    )
    # in Gyre's ChatML the same log reads differently (the format is the config's choice)
    (plain,) = read_demonstrations(log, hf, "chatml")
    assert chat_tokens(plain, hf) != head


def chat_tokens(r, hf) -> str:  # type: ignore[no-untyped-def]
    """The last call's whole sequence: its prefix chain's tokens, then its own."""
    by_id = {c.call_id: c for c in r.calls}
    seq: list[int] = []

    def walk(c) -> list[int]:  # type: ignore[no-untyped-def]
        head = walk(by_id[c.prefix.call_id])[: c.prefix.tokens] if c.prefix is not None else []
        return [*head, *c.prompt_ids.tolist(), *c.completion_ids.tolist()]

    seq = walk(r.calls[-1])
    return text(hf, seq)
