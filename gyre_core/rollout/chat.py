"""The chat format of Gyre's models, one message at a time in token ids: ChatML turns, with
tools offered in the system turn and tool calls written as ``<tool_call>`` JSON blocks (the
format Qwen3 was trained on).

A message renders to ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. Tools (OpenAI's
``tools`` list) join the system turn (one is added when the conversation has none) as JSON
lines inside ``<tools></tools>``. An assistant turn with tool calls writes each call after
its text as::

    <tool_call>
    {"name": "read_file", "arguments": {"path": "a.py"}}
    </tool_call>

and a ``tool`` message renders as a user turn whose content is wrapped in
``<tool_response>`` tags. A completion is parsed back the same way (:meth:`ChatFormat.parse`):
its text before the first ``<tool_call>`` is the content, and each block whose body is a JSON
object with a string ``name`` is a call; a block that is not stays in the content.

Messages are checked once (:func:`check_messages`, :func:`check_tools`) into a canonical
form: a :class:`ChatError` names the bad field (``messages[2].role``), as an HTTP 400 does.
Each rendered message is encoded on its own and never re-tokenised in context, so a
conversation's tokens are the concatenation of its messages' tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gyre_core.rollout.agents import Codec

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")
TOOLS_HEADER = (
    "# Tools\n\nFunctions you may call are described as JSON, one a line, inside "
    "<tools></tools>:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call one, write a JSON object with its name and arguments inside "
    '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <name>, "arguments": <object>}\n'
    "</tool_call>"
)
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class ChatError(ValueError):
    """A chat request's bad field: ``param`` names it (``messages[1].content``)."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}")
        self.param = param
        self.problem = problem


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's ``function.arguments``)


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""

    def key(self) -> str:
        """What identifies the message for prefix matching: role, content (stripped, as
        agents often strip what they send back), and each call's name and arguments as
        parsed JSON (call ids are the client's, not the model's)."""
        calls = [[c.name, _canonical(c.arguments)] for c in self.tool_calls]
        return json.dumps([self.role, self.content.strip(), calls], sort_keys=True)


def _canonical(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _text(value: Any, param: str) -> str:
    """OpenAI content: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ChatError(f"{param}[{i}]", "only text parts are supported")
            if not isinstance(part.get("text"), str):
                raise ChatError(f"{param}[{i}].text", "expected a string")
            out.append(part["text"])
        return "".join(out)
    raise ChatError(param, f"expected a string or a list of text parts, got {type(value).__name__}")


def _tool_calls(raw: Any, param: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ChatError(param, "expected a list")
    calls = []
    for i, c in enumerate(raw):
        where = f"{param}[{i}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise ChatError(f"{where}.function", "expected an object with name and arguments")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatError(f"{where}.function.name", "expected a non-empty string")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise ChatError(f"{where}.function.arguments", "expected a JSON string")
        calls.append(ToolCall(str(c.get("id", f"call_{i}")), fn["name"], args))
    return tuple(calls)


def check_messages(raw: Any) -> list[Message]:
    """OpenAI chat messages into canonical :class:`Message` objects, or a :class:`ChatError`."""
    if not isinstance(raw, list) or not raw:
        raise ChatError("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatError(where, "expected an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise ChatError(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
        content = _text(m.get("content"), f"{where}.content")
        calls = (
            _tool_calls(m.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ()
        )
        call_id = m.get("tool_call_id", "")
        if role == "tool" and not isinstance(call_id, str):
            raise ChatError(f"{where}.tool_call_id", "expected a string")
        out.append(Message(role, content, calls, call_id if role == "tool" else ""))
    return out


def check_tools(raw: Any) -> list[dict[str, Any]]:
    """OpenAI ``tools`` (function tools) as the function objects the system turn lists."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ChatError("tools", "expected a list")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatError(
                f"tools[{i}]", 'expected {"type": "function", "function": {"name": ...}}'
            )
        out.append(fn)
    return out


class ChatFormat:
    """Renders messages to token ids and parses completions, with one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
        ids = self.codec.encode(IM_END)
        self.im_end = ids[0] if len(ids) == 1 else None  # a special token in Gyre's vocabularies
        end = [self.im_end] if self.im_end is not None else []
        self._stops = tuple(sorted({*self.codec.eos_ids(), *end}))

    def stop_ids(self) -> tuple[int, ...]:
        """What ends a reply: the end-of-turn token and end-of-text."""
        return self._stops

    @staticmethod
    def body(m: Message) -> str:
        """A message's text inside its turn: its content, then its tool calls."""
        if m.role == "tool":
            return f"<tool_response>\n{m.content}\n</tool_response>"
        body = m.content
        for c in m.tool_calls:
            call = json.dumps({"name": c.name, "arguments": _canonical(c.arguments)})
            body += ("\n" if body else "") + f"<tool_call>\n{call}\n</tool_call>"
        return body

    def render(self, m: Message) -> str:
        role = "user" if m.role == "tool" else m.role
        return f"{IM_START}{role}\n{self.body(m)}{IM_END}\n"

    def with_tools(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
        """The conversation with the tools listed in its system turn (added when absent)."""
        if not tools:
            return messages
        listing = (
            TOOLS_HEADER + "\n".join(json.dumps(t, sort_keys=True) for t in tools) + TOOLS_FOOTER
        )
        if messages[0].role == "system":
            head = messages[0]
            text = f"{head.content}\n\n{listing}" if head.content else listing
            return [Message("system", text), *messages[1:]]
        return [Message("system", listing), *messages]

    def encode(self, m: Message) -> list[int]:
        return self.codec.encode(self.render(m))

    def encode_at(self, messages: list[Message], i: int) -> list[int]:
        """Message ``i`` of a conversation in tokens (in ChatML alone; a template format
        renders it in its context)."""
        return self.encode(messages[i])

    def cue(self, messages: list[Message] | None = None) -> list[int]:
        """What starts the assistant's reply after ``messages``: the generation prompt."""
        return self.codec.encode(f"{IM_START}assistant\n")

    def reply_ids(self, messages: list[Message], i: int) -> list[int]:
        """Assistant message ``i`` as the model writes it after the cue, end-of-turn
        included (for logs that carry text, not the model's token ids)."""
        return self.codec.encode(self.body(messages[i]) + IM_END)

    def closing(self, completion_ids: list[int]) -> list[int]:
        """The tokens that close a reply in the conversation after it: a newline after the
        engine's own end-of-turn token, or the end-of-turn itself when it stopped short."""
        if completion_ids and completion_ids[-1] in self.stop_ids():
            return self.codec.encode("\n")
        return self.codec.encode(f"{IM_END}\n")

    def parse(
        self, completion_ids: list[int], id_prefix: str = "call"
    ) -> tuple[str, tuple[ToolCall, ...]]:
        """A completion's content and tool calls (see the module's docstring), the calls'
        ids ``{id_prefix}-{n}``."""
        text = self.codec.decode(completion_ids)
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for n, block in enumerate(_BLOCK.finditer(text)):
            try:
                obj = json.loads(block.group(1))
            except ValueError:
                obj = None
            if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
                continue  # not a call: it stays in the content
            args = obj.get("arguments", {})
            kept.append(text[pos : block.start()])
            pos = block.end()
            calls.append(ToolCall(f"{id_prefix}-{n}", obj["name"], json.dumps(args)))
        kept.append(text[pos:])
        return "".join(kept).strip() if calls else text.strip(), tuple(calls)


__all__ = [
    "ChatError",
    "ChatFormat",
    "Message",
    "ToolCall",
    "check_messages",
    "check_tools",
]
