"""Demonstrations from outside a run: a ``gyre.trajectory/v1`` file, or an OpenAI-format
message log, read as rollouts (``warm_start.data``).

A message log is JSONL, one conversation a line::

    {"id": "ep-1", "messages": [...], "tools": [...], "reward": 1.0, "task_id": "t", "group": "g"}

``messages`` are OpenAI chat messages; an assistant message may carry the ``token_ids`` the
model generated and their ``logprobs``. Every assistant message is one call: its prompt is
the conversation before it in the chat format (:mod:`~gyre_core.rollout.chat`; ``tools`` in
the system turn), its completion the message's ``token_ids``, or its text and tool calls
tokenized with the end-of-turn token when it has none. Calls are matched to earlier ones as
the endpoint matches them (:mod:`~gyre_core.rollout.chat_session`): a conversation that
rewrites its history (a compaction) branches. ``reward`` (default 0) is the rollout's
progress and reward; ``group`` (default ``task_id``, else ``id``) its group: conversations
of one group share a tree, and RL advantages are relative to their group. A rollout whose every generated message carries ``logprobs`` says so
(``extra["logprobs"]``): only such a rollout's log-probs are the sampling policy's; the
others hold zeros, for supervised use only.

A bad line is a :class:`~gyre_core.trajectory.format.TrajectoryFormatError`:
``FILE:LINE: FIELD: problem``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gyre_core.jsonl import json_lines
from gyre_core.rollout.chat import (
    ChatError,
    ChatFormat,
    check_messages,
    check_tools,
)
from gyre_core.rollout.chat_session import ChatSession
from gyre_core.rollout.chat_template import chat_format
from gyre_core.rollout.engine import Completion
from gyre_core.trajectory.format import FORMAT, Rollout, TrajectoryFormatError, read_rollouts


def is_chat_log(path: Path) -> bool:
    """Whether ``path`` holds message logs (else a ``gyre.trajectory/v1`` file)."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    head = json.loads(line)
                except ValueError:
                    return False  # read_rollouts names the bad line
                return (
                    isinstance(head, dict) and head.get("format") != FORMAT and "messages" in head
                )
    return False


def read_demonstrations(path: Path, tokenizer: Any, template: str = "chatml") -> list[Rollout]:
    """The rollouts of either kind of file (see the module); message logs are rendered in
    the chat format ``template`` names (``model.chat_template``)."""
    if not is_chat_log(path):
        return list(read_rollouts(path))
    fmt = chat_format(tokenizer, template)
    out: list[Rollout] = []
    seen: set[str] = set()
    for lineno, obj in json_lines(path, TrajectoryFormatError):
        r = _conversation(obj, fmt, str(path), lineno)
        if r.rollout_id in seen:
            raise TrajectoryFormatError(str(path), lineno, "id", f"duplicate id {r.rollout_id!r}")
        seen.add(r.rollout_id)
        out.append(r)
    return out


def _conversation(obj: Any, fmt: ChatFormat, name: str, lineno: int) -> Rollout:
    def fail(field: str, problem: str) -> TrajectoryFormatError:
        return TrajectoryFormatError(name, lineno, field, problem)

    if not isinstance(obj, dict):
        raise fail("<line>", "expected a JSON object")
    rid = obj.get("id", f"line-{lineno}")
    if not isinstance(rid, str) or not rid:
        raise fail("id", "expected a non-empty string")
    reward = obj.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise fail("reward", f"expected a number, got {reward!r}")
    raw: list[dict[str, Any]] = obj.get("messages")  # type: ignore[assignment]
    try:
        messages = check_messages(raw)
        tools = check_tools(obj.get("tools"))
    except ChatError as e:
        raise fail(e.param, e.problem) from None
    chat = ChatSession(rid, fmt)
    exact = True
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        if i == 0:
            raise fail("messages[0]", "an assistant message needs the messages it answers")
        try:
            upto = fmt.with_tools(messages[: i + 1], tools)
            ids, logprobs = _generated(raw[i], upto, fmt, f"messages[{i}]", fail)
            prompt = chat.prompt(upto[:-1])
        except ChatError as e:
            raise fail(e.param, e.problem) from None
        exact = exact and logprobs is not None
        call_id, _ = chat.reserve()
        n = len(ids)
        chat.record(call_id, prompt, Completion(ids, logprobs or [0.0] * n, [0] * n, "stop"))
    if not chat.calls:
        raise fail("messages", "no assistant message: nothing to train")
    task = str(obj.get("task_id", rid))
    group = obj.get("group", task)
    if not isinstance(group, str) or not group:
        raise fail("group", "expected a non-empty string")
    return chat.rollout(
        task, "completed", float(reward), group, extra={"logprobs": exact, "source": "chat_log"}
    )


def _generated(
    raw: dict[str, Any], upto: list[Any], fmt: ChatFormat, where: str, fail: Any
) -> tuple[list[int], list[float] | None]:
    ids = raw.get("token_ids")
    if ids is None:
        return fmt.reply_ids(upto, len(upto) - 1), None
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
    ):
        raise fail(f"{where}.token_ids", "expected a non-empty list of token ids")
    lp = raw.get("logprobs")
    if lp is None:
        return ids, None
    if (
        not isinstance(lp, list)
        or len(lp) != len(ids)
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and x <= 1e-3 for x in lp)
    ):
        raise fail(
            f"{where}.logprobs", f"expected {len(ids)} log-probabilities (<= 0), one a token id"
        )
    return ids, [float(x) for x in lp]


__all__ = ["is_chat_log", "read_demonstrations"]
