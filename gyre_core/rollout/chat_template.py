"""Chat messages rendered by a checkpoint's own chat template (``model.chat_template:
checkpoint``), one message at a time, with the interface of :class:`ChatFormat`.

A Hugging Face chat template renders a whole conversation. The recorder needs each message's
tokens on their own (earlier messages' tokens are reused, never re-tokenised), so message
``i`` is the text the template adds when the conversation grows from ``messages[:i]`` to
``messages[:i + 1]``, encoded alone; the reply's cue is what ``add_generation_prompt`` adds.
That holds when the template is *prefix-stable* there (rendering a conversation starts with
the rendering of its beginning). Where it is not (templates that rewrite earlier turns once
a later one exists, such as dropping an earlier turn's reasoning), message ``i`` is rendered
after the conversation's system turn alone; if that too is unstable the call is refused with
a :class:`ChatError` naming the message, since no per-message tokens would match the
template.

Tools are passed to the template as ``tools``; :meth:`TemplateFormat.with_tools` keeps
them in a leading marker message (role ``tools``, rendered as nothing) so that a call with
other tools shares nothing with earlier ones. A reply's tool calls are parsed as the
ChatML format parses them (``<tool_call>`` JSON blocks, the Qwen3 family's format); the
closing of a reply (what the template writes after an assistant message's text) is found
once, from a probe conversation.
"""

from __future__ import annotations

import json
from typing import Any

from gyre_core.rollout.chat import ChatError, ChatFormat, Message, _canonical
from gyre_core.rollout.plugins import PluginError

TOOLS_ROLE = "tools"
_PROBE = "GYRE-PROBE-REPLY"


class TemplateFormat(ChatFormat):
    """:class:`ChatFormat` with a Jinja chat template (``tokenizer.chat_template`` or
    ``template``) doing the rendering."""

    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        super().__init__(tokenizer)
        self.template = template or getattr(tokenizer, "chat_template", None)
        if not isinstance(self.template, str) or not self.template:
            raise ValueError("the tokenizer has no chat template")
        if not callable(getattr(tokenizer, "apply_chat_template", None)):
            raise ValueError("the tokenizer cannot apply a chat template")
        self.hf = tokenizer
        probe = [{"role": "user", "content": "x"}]
        head = self._text(probe, (), generation=True)
        full = self._text([*probe, {"role": "assistant", "content": _PROBE}], (), False)
        at = full.find(_PROBE, len(head) if full.startswith(head) else 0)
        if at < 0:
            raise ValueError("the chat template does not write an assistant message's content")
        self._close = full[at + len(_PROBE) :]  # what follows a reply's text
        # The end-of-turn token, when the closing starts with a special one.
        ids = self.codec.encode(self._close)
        first = ids[0] if ids else None
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self._end_id = first if first in special else None
        eos = set(self.codec.eos_ids())
        self._stops = tuple(sorted(eos | ({self._end_id} if self._end_id is not None else set())))

    # ------------------------------------------------------------------ rendering

    def _text(self, conv: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        out = self.hf.apply_chat_template(
            conv,
            tools=list(tools) or None,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=generation,
        )
        return str(out)

    @staticmethod
    def _split(messages: list[Message]) -> tuple[list[Message], list[dict[str, Any]], int]:
        """The conversation without the tools marker, its tools, and the marker's count."""
        if messages and messages[0].role == TOOLS_ROLE:
            return list(messages[1:]), json.loads(messages[0].content), 1
        return list(messages), [], 0

    @staticmethod
    def _dict(m: Message) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _canonical(c.arguments)},
                }
                for c in m.tool_calls
            ]
        if m.role == "tool" and m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        return d

    def _delta(self, before: list[Message], m: Message, tools: Any) -> str | None:
        conv = [self._dict(x) for x in before]
        head = self._text(conv, tools, False) if conv else ""
        full = self._text([*conv, self._dict(m)], tools, False)
        return full[len(head) :] if full.startswith(head) else None

    def encode_at(self, messages: list[Message], i: int) -> list[int]:
        conv, tools, skip = self._split(messages)
        if i < skip:
            return []  # the tools marker: its text comes with the conversation's first turn
        j = i - skip
        m = conv[j]
        text = self._delta(conv[:j], m, tools)
        if text is None and j > 1 and conv[0].role == "system":  # after the system turn alone
            text = self._delta(conv[:1], m, tools)
        if text is None:
            raise ChatError(
                f"messages[{j}]",
                "the checkpoint's chat template renders the conversation before this message "
                "differently once it is added, so its tokens cannot be recorded one message "
                "at a time (model.chat_template: chatml renders every message alike)",
            )
        return self.codec.encode(text)

    def cue(self, messages: list[Message] | None = None) -> list[int]:
        conv, tools, _ = self._split(list(messages or []))
        dicts = [self._dict(x) for x in conv]
        head = self._text(dicts, tools, False) if dicts else ""
        full = self._text(dicts, tools, True)
        return self.codec.encode(full[len(head) :] if full.startswith(head) else full)

    def with_tools(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
        if not tools:
            return messages
        listed = [{"type": "function", "function": fn} for fn in tools]  # OpenAI's form
        return [Message(TOOLS_ROLE, json.dumps(listed)), *messages]

    def closing(self, completion_ids: list[int]) -> list[int]:
        ids = self.codec.encode(self._close)
        if completion_ids and completion_ids[-1] in self.stop_ids() and ids:
            stopped = completion_ids[-1]
            if ids[0] == stopped:
                return ids[1:]
            if stopped in self.codec.eos_ids() and self._end_id is not None:
                return ids[1:]  # the engine ended on end-of-text where the template ends a turn
        return ids

    def reply_ids(self, messages: list[Message], i: int) -> list[int]:
        """Message ``i`` (an assistant's) as the model writes it after the cue: its text in
        the template, up to and including the end-of-turn token."""
        conv, tools, skip = self._split(messages)
        j = i - skip
        dicts = [self._dict(x) for x in conv[:j]]
        head = self._text(dicts, tools, True)
        full = self._text([*dicts, self._dict(conv[j])], tools, False)
        if not full.startswith(head):
            raise ChatError(f"messages[{j}]", "the chat template does not continue its cue here")
        text = full[len(head) :]
        if self._close and text.endswith(self._close):
            text = text[: -len(self._close)]
        end = [self._end_id] if self._end_id is not None else list(self.codec.eos_ids()[:1])
        return self.codec.encode(text) + end


def chat_format(tokenizer: Any, template: str) -> ChatFormat:
    """The format ``model.chat_template`` names: ``chatml`` (Gyre's renderer) or
    ``checkpoint`` (the tokenizer's own template)."""
    if template == "chatml":
        return ChatFormat(tokenizer)
    if template == "checkpoint":
        try:
            return TemplateFormat(tokenizer)
        except ValueError as e:
            raise PluginError("model.chat_template", str(e)) from None
    raise PluginError("model.chat_template", f"expected chatml or checkpoint, got {template!r}")


__all__ = ["TOOLS_ROLE", "TemplateFormat", "chat_format"]
