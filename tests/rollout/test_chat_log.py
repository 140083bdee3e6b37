"""Demonstrations from outside a run: OpenAI message logs (with or without the model's token
ids and log-probs) and gyre.trajectory/v1 files, read as rollouts, refused by line and field
when bad, and trained on by the warm start (``warm_start.data``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import ListSink
from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer
from gyre_core.rollout.chat import ChatFormat
from gyre_core.rollout.chat_log import read_demonstrations
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.warm_start import WarmStart
from gyre_core.trajectory.format import TrajectoryFormatError
from gyre_core.trajectory.tree import build_trees

ROOT = Path(__file__).parents[2]
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok() -> Any:
    return as_hf_tokenizer(train_tokenizer(default_corpus(), 600))


def conversation(fmt: ChatFormat, *, exact: bool) -> dict[str, Any]:
    ids = fmt.codec.encode(
        '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
    )
    first: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]}  # fmt: skip
    last: dict[str, Any] = {"role": "assistant", "content": "Done."}
    if exact:
        first |= {"token_ids": ids, "logprobs": [-0.25] * len(ids)}
        done = fmt.codec.encode("Done.<|im_end|>")
        last |= {"token_ids": done, "logprobs": [-0.5] * len(done)}
    return {"id": "ep-exact" if exact else "ep-text", "reward": 0.5, "tools": TOOLS, "messages": [
        {"role": "system", "content": "Fix the bug."}, {"role": "user", "content": "Go."}, first,
        {"role": "tool", "tool_call_id": "a", "content": "a.py"}, last]}  # fmt: skip


def test_a_message_log_reads_as_rollouts_with_the_models_own_tokens(tok, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fmt = ChatFormat(tok)
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(conversation(fmt, exact=e)) + "\n" for e in (True, False)))
    exact, text = read_demonstrations(path, tok)
    c0, c1 = exact.calls
    given = conversation(fmt, exact=True)["messages"][2]
    assert [int(t) for t in c0.completion_ids] == given["token_ids"]
    assert [float(x) for x in c0.logprobs] == given["logprobs"] and exact.extra["logprobs"] is True
    assert c1.kind == "continue" and c1.prefix is not None and c1.prefix.call_id == "c0"
    assert (exact.reward, exact.progress) == (0.5, 0.5)
    # without token ids: the text and its calls in the chat format; zeros, supervised only
    assert (
        text.extra["logprobs"] is False
        and [int(t) for t in text.calls[0].completion_ids] == given["token_ids"]
    )
    assert len(build_trees([exact, text])) == 2


def test_a_trajectory_file_reads_as_it_is(tok) -> None:  # type: ignore[no-untyped-def]
    rollouts = read_demonstrations(ROOT / "docs" / "examples" / "trajectory.jsonl", tok)
    assert rollouts and all(r.calls for r in rollouts)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "token_ids": [1, -1]}]},
         "messages[1].token_ids"),
        ({"messages": [{"role": "user", "content": "q"},
                       {"role": "assistant", "content": "a", "token_ids": [1, 2], "logprobs": [-1.0]}]},
         "messages[1].logprobs"),
        ({"reward": "high", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
         "reward"),
    ],
)  # fmt: skip
def test_a_bad_line_is_refused_by_line_and_field(
    tok, tmp_path, line: dict[str, Any], field: str
) -> None:  # type: ignore[no-untyped-def]
    good = {
        "id": "ok",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(TrajectoryFormatError) as e:
        read_demonstrations(path, tok)
    assert f"log.jsonl:2: {field}:" in str(e.value)


def test_the_warm_start_trains_on_a_message_log(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d: dict[str, Any] = {"model": {"layers": 1},
                         "warm_start": {"steps": 6, "demos": 2, "lr": 1e-2}}  # fmt: skip
    model_dir = make_model_dir(RunConfig.from_dict(d), tmp_path)
    from transformers import AutoTokenizer

    fmt = ChatFormat(AutoTokenizer.from_pretrained(str(model_dir)))
    log = tmp_path / "demos.jsonl"
    log.write_text("".join(json.dumps(conversation(fmt, exact=e)) + "\n" for e in (True, False)))
    d["warm_start"]["data"] = str(log)
    cfg = RunConfig.from_dict({**d, "model": {"checkpoint": str(model_dir)}})
    factory = SessionFactory(cfg, model_dir, ListSink(), lambda: 0.0)
    losses = asyncio.run(WarmStart(factory).run(factory.make_trainer()))
    assert len(losses) == 6 and losses[-1] < losses[0]  # it learns the logged replies
    with pytest.raises(ConfigError, match="not both"):
        RunConfig.from_dict({"warm_start": {"data": str(log), "weights": "w.safetensors"}})
