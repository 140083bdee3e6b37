"""The chat format (render, tools, tool-call parsing, checks by field) and the endpoint's
session recorder (token reuse on extension, branches at the shared messages)."""

from __future__ import annotations

import json

import pytest

from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer
from gyre_core.rollout.chat import ChatError, ChatFormat, Message, check_messages, check_tools
from gyre_core.rollout.chat_session import ChatSession
from gyre_core.rollout.engine import Completion
from gyre_core.trajectory.tree import build_trees

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat(as_hf_tokenizer(train_tokenizer(default_corpus(), 600)))


def reply(fmt: ChatFormat, text: str, version: int = 0, *, closed: bool = True) -> Completion:
    ids = fmt.codec.encode(text + ("<|im_end|>" if closed else ""))
    return Completion(ids, [-0.5] * len(ids), [version] * len(ids), "stop" if closed else "length")


def test_messages_render_one_at_a_time_and_tools_join_the_system_turn(fmt: ChatFormat) -> None:
    msgs = check_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert fmt.render(msgs[0]) == "<|im_start|>user\nhi<|im_end|>\n"
    with_tools = fmt.with_tools(msgs, check_tools(TOOLS))
    assert with_tools[0].role == "system" and '"name": "read_file"' in with_tools[0].content
    sys_first = fmt.with_tools(
        check_messages([{"role": "system", "content": "Be brief."}]), check_tools(TOOLS)
    )
    assert sys_first[0].content.startswith("Be brief.\n\n# Tools")
    tool = check_messages([{"role": "tool", "tool_call_id": "x", "content": "data"}])[0]
    assert (
        fmt.render(tool) == "<|im_start|>user\n<tool_response>\ndata\n</tool_response><|im_end|>\n"
    )
    # <|im_end|> is one special token, and it stops generation
    assert fmt.im_end is not None and fmt.im_end in fmt.stop_ids()


def test_a_completion_parses_into_content_and_tool_calls(fmt: ChatFormat) -> None:
    content, calls = fmt.parse(fmt.codec.encode(f"Let me look.\n{CALL}<|im_end|>"))
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("read_file", {"path": "a.py"})
    ]
    # a block that is not a JSON call stays in the text; no call
    text = "<tool_call>\nnot json\n</tool_call>"
    assert fmt.parse(fmt.codec.encode(text)) == (text, ())
    # an assistant message with that call renders back to the same text
    sent = check_messages(
        [{"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]}]
    )[0]  # fmt: skip
    assert fmt.render(sent) == f"<|im_start|>assistant\nLet me look.\n{CALL}<|im_end|>\n"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([], "messages"),
        ([{"role": "bot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "a"}, "b"], "messages[1]"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": ""}}]}],
         "messages[0].tool_calls[0].function.name"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
         "messages[0].tool_calls[0].function.arguments"),
    ],
)  # fmt: skip
def test_a_bad_message_is_refused_by_its_field(raw: object, param: str) -> None:
    with pytest.raises(ChatError) as e:
        check_messages(raw)
    assert e.value.param == param


def test_a_bad_tool_is_refused_by_its_field() -> None:
    with pytest.raises(ChatError, match=r"tools\[1\]"):
        check_tools([TOOLS[0], {"type": "function", "function": {}}])


def test_a_call_that_extends_reuses_the_recorded_tokens_and_one_that_does_not_branches(
    fmt: ChatFormat,
) -> None:
    s = ChatSession("r0", fmt)
    base = fmt.with_tools(
        check_messages(
            [{"role": "system", "content": "Fix a.py."}, {"role": "user", "content": "Go."}]
        ),
        check_tools(TOOLS),
    )
    p0 = s.prompt(base)
    assert p0.prefix is None and p0.ids[-len(fmt.cue()) :] == fmt.cue()
    cid, _ = s.reserve()
    out0 = reply(fmt, f"I will read it.{CALL}", version=3)
    content, calls = s.record(cid, p0, out0)
    assert content == "I will read it." and calls[0].name == "read_file"

    # The agent sends back what it got (content stripped, call ids its own) and a result.
    back = Message("assistant", content + "  ", calls)
    convo = [
        *base,
        back,
        *check_messages([{"role": "tool", "tool_call_id": "x", "content": "print(1)"}]),
    ]
    p1 = s.prompt(convo)
    full0 = p0.ids + out0.token_ids
    assert p1.prefix is not None and (p1.prefix.call_id, p1.prefix.tokens) == ("c0", len(full0))
    assert p1.ids[: len(full0)] == full0  # the engine's tokens, not a re-tokenisation
    cid, _ = s.reserve()
    s.record(cid, p1, reply(fmt, "Done.", version=4))

    # Compaction: the first two messages, then a summary instead of the history.
    p2 = s.prompt([*base, *check_messages([{"role": "user", "content": "Summary: read a.py."}])])
    shared = len(fmt.encode(base[0]) + fmt.encode(base[1]))
    assert p2.prefix is not None and (p2.prefix.call_id, p2.prefix.tokens) == ("c1", shared)
    assert p2.ids[:shared] == p0.ids[:shared]
    cid, _ = s.reserve()
    s.record(cid, p2, reply(fmt, "ok", closed=False))
    assert [c.kind for c in s.calls] == ["continue", "continue", "branch"]
    assert [int(v) for v in s.calls[0].versions] == [3] * len(out0.token_ids)

    # A conversation sharing nothing is a new root; the tree has the branch.
    p3 = s.prompt(check_messages([{"role": "user", "content": "Other."}]))
    assert p3.prefix is None
    tree = build_trees([s.rollout("task", "completed", 1.0)])["r0"]
    assert len(list(tree.leaves())) == 2  # the history and the compacted branch
    seq1 = p1.ids + [int(t) for t in s.calls[1].completion_ids]
    seq2 = p2.ids + [int(t) for t in s.calls[2].completion_ids]
    common = next(i for i, (a, b) in enumerate(zip(seq1, seq2, strict=False)) if a != b)
    assert common >= shared  # the tree shares at least the two messages' tokens
    assert tree.tokens_unique == len(seq1) + len(seq2) - common


def test_a_reply_cut_by_its_length_is_closed_before_the_next_message(fmt: ChatFormat) -> None:
    s = ChatSession("r0", fmt)
    msgs = check_messages([{"role": "user", "content": "Go."}])
    p0 = s.prompt(msgs)
    cid, _ = s.reserve()
    out = reply(fmt, "partial", closed=False)
    content, _ = s.record(cid, p0, out)
    p1 = s.prompt(
        [
            *msgs,
            Message("assistant", content),
            *check_messages([{"role": "user", "content": "more"}]),
        ]
    )
    tail = p1.ids[len(p0.ids) + len(out.token_ids) :]
    assert fmt.codec.decode(tail).startswith("\n<|im_start|>user") or tail[0] == fmt.im_end


def test_plain_completions_share_tokens_with_earlier_calls(fmt: ChatFormat) -> None:
    s = ChatSession("r0", fmt)
    ids = fmt.codec.encode("def f():\n")
    p0 = s.text_prompt(ids)
    cid, _ = s.reserve()
    out = reply(fmt, "    return 1", closed=False)
    s.record(cid, p0, out)
    p1 = s.text_prompt([*ids, *out.token_ids, *fmt.codec.encode("\n\nf()")])
    assert p1.prefix is not None and p1.prefix.tokens == len(ids) + len(out.token_ids)
