"""The OpenAI-compatible endpoint with a real model behind a real router: an agent process
that imports only ``openai`` runs through it, and what the session records is what the
engine produced, token for token with versions, across a tool call and a compaction branch.
Bad requests get 4xx JSON naming the field."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.rollout.chat import ChatFormat, Message, check_messages, check_tools
from gyre_core.rollout.chat_template import TemplateFormat, chat_format
from gyre_core.rollout.endpoint import Endpoint
from gyre_core.rollout.engine import Completion, SamplingParams
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.trajectory.tree import build_trees

AGENT = Path(__file__).parent / "agents" / "openai_tool_agent.py"
sys.path.insert(0, str(AGENT.parent))
import openai_tool_agent as agent  # noqa: E402  (the agent's own prompts and tools)

TASK_FILE = "Fix the bug in a.py."
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "TASK.md"}}\n</tool_call>'
VERSION = 7


@pytest.fixture(scope="module")
def taught(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """A tiny model taught to answer the agent's task with a ``read_file`` call and the
    tool's result with "Done.", so that its own greedy output carries a tool call."""
    md = make_model_dir(RunConfig.from_dict({"model": {"layers": 1}}), tmp_path_factory.mktemp("m"))
    model = AutoModelForCausalLM.from_pretrained(str(md), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(md))
    fmt = ChatFormat(tok)
    first = fmt.with_tools(
        check_messages(
            [{"role": "system", "content": agent.SYSTEM}, {"role": "user", "content": agent.TASK}]
        ),
        check_tools(agent.TOOLS),
    )
    p1 = [t for m in first for t in fmt.encode(m)] + fmt.cue()
    call = fmt.codec.encode(CALL + "<|im_end|>")
    p2 = [*p1, *call, *fmt.closing(call), *fmt.encode(Message("tool", TASK_FILE)), *fmt.cue()]
    pairs = [(p1, call), (p2, fmt.codec.encode("Done.<|im_end|>"))]
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(80):
        for prompt, target in pairs:
            ids = torch.tensor([prompt + target])
            labels = torch.tensor([[-100] * len(prompt) + target])
            model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval(), tok


class Spy(TorchEngine):
    """The engine, noting what it returned for each request."""

    def __init__(self, model: Any) -> None:
        super().__init__(model, version=VERSION)
        self.outputs: dict[str, Completion] = {}

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        out = await super().generate(prompt_ids, params, request_id=request_id)
        self.outputs[request_id] = out
        return out


def test_an_openai_agent_is_recorded_token_for_token_with_its_branch(taught, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, tok = taught
    (tmp_path / "TASK.md").write_text(TASK_FILE)
    spy = Spy(model)

    async def main() -> tuple[Any, str]:
        ep = Endpoint(tok)
        await ep.start()
        s = ep.open("r0", Router({"e": spy}), max_tokens=48, temperature=0.0, seed=1)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(AGENT), s.base_url, str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        await ep.close()
        assert proc.returncode == 0, err.decode()[-3000:]
        return ep.close_session(s.key), out.decode()

    chat, printed = asyncio.run(main())
    seen = json.loads(printed.strip().splitlines()[-1])
    assert seen["tool_calls"] == [["read_file", {"path": "TASK.md"}]]  # parsed from the model
    assert seen["replies"][-1] == "Done."
    assert [c.kind for c in chat.calls] == ["continue", "continue", "branch"]
    for call in chat.calls:  # what was recorded is what the engine produced
        out = spy.outputs[f"r0/{call.call_id}"]
        assert [int(t) for t in call.completion_ids] == out.token_ids
        assert [float(x) for x in call.logprobs] == out.logprobs
        assert [int(v) for v in call.versions] == out.versions == [VERSION] * len(out.token_ids)
    c0, c1, c2 = chat.calls
    # the second call's prompt is the first call's whole sequence, the tool result after it
    assert c1.prefix is not None and c1.prefix.call_id == "c0"
    assert c1.prefix.tokens == len(c0.prompt_ids) + len(c0.completion_ids)
    # the compacted call branches after the system and task messages
    assert c2.prefix is not None and 0 < c2.prefix.tokens < len(c0.prompt_ids)
    rollout = chat.rollout("task-1", "completed", 1.0)
    tree = build_trees([rollout])["r0"]
    assert len(list(tree.leaves())) == 2
    assert seen["streamed"] == ChatFormat(tok).parse([int(t) for t in c2.completion_ids])[0]


def test_bad_requests_get_json_errors_naming_the_field(taught) -> None:  # type: ignore[no-untyped-def]
    model, tok = taught

    async def main() -> list[tuple[int, Any]]:
        ep = Endpoint(tok)
        url = await ep.start()
        s = ep.open(
            "r0",
            Router({"e": TorchEngine(model)}),
            max_tokens=4,
            temperature=1.0,
            seed=0,
            max_calls=2,
        )
        ok = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"Authorization": f"Bearer {s.key}"}
        got = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for path, body, headers in [
                ("/v1/chat/completions", ok, {"Authorization": "Bearer nope"}),
                (f"/s/{s.key}/v1/chat/completions", {**ok, "messages": [{"role": "x"}]}, {}),
                ("/v1/chat/completions", {**ok, "max_tokens": 0}, auth),
                ("/v1/chat/completions", {**ok, "temperature": "hot"}, auth),
                ("/v1/chat/completions", {"messages": ok["messages"]}, auth),
                ("/v1/chat/completions", {**ok, "tools": [{"type": "function"}]}, auth),
                ("/v1/completions", {"model": "p", "prompt": [1, -2]}, auth),
                ("/v1/nowhere", ok, auth),
            ]:
                r = await c.post(path, json=body, headers=headers)
                got.append((r.status_code, r.json()["error"]))
            r = await c.post("/v1/chat/completions", content=b"{not json", headers=auth)
            got.append((r.status_code, r.json()["error"]))
            r = await c.post("/v1/chat/completions", json=ok, headers=auth)
            got.append((r.status_code, r.json()["usage"]["completion_tokens"]))  # still serving
            r = await c.get("/v1/models", headers=auth)
            got.append((r.status_code, r.json()["data"][0]["id"]))
            r = await c.post("/v1/completions", json={"model": "p", "prompt": "x"}, headers=auth)
            got.append(
                (r.status_code, r.json()["choices"][0]["finish_reason"] in ("stop", "length"))
            )
            r = await c.post("/v1/chat/completions", json=ok, headers=auth)  # max_calls=2
            got.append((r.status_code, r.json()["error"]["type"]))
            assert s.stop_reason == "max_turns"
            ep.close_session(s.key)
            r = await c.post("/v1/chat/completions", json=ok, headers=auth)
            got.append((r.status_code, r.json()["error"]))
        await ep.close()
        return got

    got = asyncio.run(main())
    params = [(code, e["param"]) if isinstance(e, dict) else (code, e) for code, e in got]
    assert params == [
        (401, None), (400, "messages[0].role"), (400, "max_tokens"), (400, "temperature"),
        (400, "model"), (400, "tools[0]"), (400, "prompt"), (404, None), (400, "body"),
        (200, 4), (200, "gyre-policy"), (200, True), (429, "budget_exhausted"), (409, None),
    ]  # fmt: skip
    assert all("Traceback" not in str(e) for _, e in got)


def test_the_endpoint_benchmark_measures_both_paths() -> None:
    sys.path.insert(0, str(Path(__file__).parents[2]))
    from benchmarks.endpoint_bench import main

    rows = main(["--sessions", "1", "3", "--calls", "4"])
    assert [r["sessions"] for r in rows] == [1, 3]
    for r in rows:
        for path in ("in_process", "endpoint"):
            assert r[path]["calls"] == 4 * r["sessions"] and r[path]["calls_per_s"] > 0


def test_an_engine_failure_is_a_json_500_and_the_endpoint_serves_on(taught) -> None:  # type: ignore[no-untyped-def]
    model, tok = taught

    class Failing(TorchEngine):
        async def generate(self, prompt_ids, params, *, request_id):  # type: ignore[no-untyped-def]
            if request_id.endswith("/c0"):
                raise ValueError("the engine rejected the request")
            return await super().generate(prompt_ids, params, request_id=request_id)

    async def main() -> list[tuple[int, Any]]:
        ep = Endpoint(tok)
        url = await ep.start()
        s = ep.open("r0", Router({"e": Failing(model)}), max_tokens=4, temperature=1.0, seed=0)
        body = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(base_url=s.base_url, timeout=60) as c:
            got = []
            for _ in range(2):
                r = await c.post("/chat/completions", json=body)
                got.append((r.status_code, r.json()))
        await ep.close()
        assert url
        return got

    (code, err), (ok, reply) = asyncio.run(main())
    assert (
        code == 500
        and err["error"]["type"] == "server_error"
        and "ValueError" in err["error"]["message"]
    )
    assert ok == 200 and reply["usage"]["completion_tokens"] >= 1


def test_the_checkpoints_own_template_renders_the_calls(taught) -> None:  # type: ignore[no-untyped-def]
    """``model.chat_template: checkpoint``: the engine is given the template's rendering of
    the conversation; a template that rewrites earlier turns is a 400 naming the message."""
    model, tok = taught
    prompts: list[list[int]] = []

    class Seen(TorchEngine):
        async def generate(self, prompt_ids, params, *, request_id):  # type: ignore[no-untyped-def]
            prompts.append(list(prompt_ids))
            return await super().generate(prompt_ids, params, request_id=request_id)

    unstable = "{% for m in messages %}{{ m['role'] }} of {{ messages | length }}: {{ m['content'] }}\n{% endfor %}"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]

    async def main(fmt: ChatFormat) -> tuple[int, Any]:
        ep = Endpoint(tok, fmt=fmt)
        await ep.start()
        s = ep.open("r0", Router({"e": Seen(model)}), max_tokens=4, temperature=1.0, seed=0)
        async with httpx.AsyncClient(base_url=s.base_url, timeout=60) as c:
            r = await c.post("/chat/completions", json={"model": "p", "messages": messages})
        await ep.close()
        return r.status_code, r.json()

    code, _ = asyncio.run(main(chat_format(tok, "checkpoint")))
    assert code == 200 and tok.decode(prompts[-1], skip_special_tokens=False) == (
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )
    code, err = asyncio.run(main(TemplateFormat(tok, unstable)))
    assert code == 400 and err["error"]["param"] == "messages[1]", err


def test_a_prompt_beyond_the_models_positions_is_a_400_naming_it(taught, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A prompt that leaves the model no position to generate in is refused with OpenAI's
    context_length_exceeded 400, naming the field and both lengths (it was served with a
    warning); one that fits has its cap lowered to the positions left. A run's endpoint
    takes the positions from its checkpoint, lowered by engine.max_model_len."""
    model, tok = taught
    limit = 64

    async def main() -> list[tuple[int, Any]]:
        ep = Endpoint(tok, max_positions=limit)
        await ep.start()
        s = ep.open("r0", Router({"e": TorchEngine(model)}), max_tokens=32, temperature=1.0,
                    seed=0)  # fmt: skip
        long = {"model": "p", "messages": [{"role": "user", "content": "hi " * 200}]}
        got = []
        async with httpx.AsyncClient(base_url=s.base_url, timeout=60) as c:
            for path, body in [
                ("/chat/completions", long),
                ("/completions", {"model": "p", "prompt": [5] * limit}),
                ("/completions", {"model": "p", "prompt": [5] * (limit - 3)}),
            ]:
                r = await c.post(path, json=body)
                got.append((r.status_code, r.json()))
        await ep.close()
        return got

    (chat, err), (text, err2), (ok, reply) = asyncio.run(main())
    e = err["error"]
    assert (chat, e["type"], e["param"], e["code"]) == (
        400, "invalid_request_error", "messages", "context_length_exceeded"
    )  # fmt: skip
    assert f"maximum context length is {limit} tokens" in e["message"]
    assert (
        text == 400
        and err2["error"]["param"] == "prompt"
        and f"are {limit} tokens" in (err2["error"]["message"])
    )
    assert ok == 200 and reply["usage"]["completion_tokens"] <= 3

    cfg = RunConfig.from_dict({"model": {"layers": 1}})
    md = make_model_dir(cfg, tmp_path)
    assert SessionFactory(cfg, md, ListSink(), lambda: 0.0).positions() == 4096
    low = RunConfig.from_dict({"model": {"layers": 1}, "engine": {"max_model_len": 1000}})
    assert SessionFactory(low, md, ListSink(), lambda: 0.0).positions() == 1000
