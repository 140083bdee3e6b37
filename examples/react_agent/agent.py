"""A ReAct-style coding agent on the OpenAI chat API, with nothing of Gyre in it.

It reads its task from the environment a Gyre run gives each rollout (any other harness can
set the same variables), works in the task's folder with three tools, and stops when it says
DONE, when its turns run out, or when the server says its budget is spent:

    OPENAI_BASE_URL, OPENAI_API_KEY  the session's endpoint (read by the openai client)
    GYRE_MODEL                       the model name to ask for
    GYRE_TASK_PROMPT                 what to do
    GYRE_TASK_DIR                    the folder it may read, write and run commands in

Past ``--context-budget`` prompt tokens it compacts: it asks the model for a summary of its
work and carries on from the task and that summary alone, so its calls form a tree with a
branch.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 GYRE_TASK_PROMPT="..." GYRE_TASK_DIR=/tmp/t \\
        python examples/react_agent/agent.py --context-budget 1500 --max-turns 30
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import openai

COMMAND_TIMEOUT_S = 20
OUTPUT_TAIL = 2000  # characters of a tool's output the model sees

SYSTEM = (
    "You are a careful software engineer. Work in the task folder with the tools: read "
    "files, write files, run commands (for example the tests with `python -m pytest -q`). "
    "When the task is complete, reply with DONE and no tool call."
)
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the task folder.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file of the task folder.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "run", "description": "Run a shell command in the task folder.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
]  # fmt: skip


def inside(folder: Path, path: str) -> Path:
    full = (folder / path).resolve()
    if not full.is_relative_to(folder):
        raise ValueError(f"{path!r} is outside the task folder")
    return full


def use_tool(folder: Path, name: str, arguments: str) -> str:
    """Run one tool call; what it returns (or why it failed) is the observation."""
    try:
        args = json.loads(arguments)
        if name == "read_file":
            return inside(folder, args["path"]).read_text(errors="replace")[-OUTPUT_TAIL:]
        if name == "write_file":
            target = inside(folder, args["path"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(args["content"])
            return f"wrote {len(args['content'])} characters to {args['path']}"
        if name == "run":
            done = subprocess.run(
                args["command"], shell=True, cwd=folder, capture_output=True, text=True,
                timeout=COMMAND_TIMEOUT_S,
            )  # fmt: skip
            return f"exit code {done.returncode}\n{(done.stdout + done.stderr)[-OUTPUT_TAIL:]}"
        return f"error: no tool named {name!r}"
    except (ValueError, KeyError, TypeError, OSError, subprocess.TimeoutExpired) as e:
        return f"error: {type(e).__name__}: {e}"


def compact(client: openai.OpenAI, model: str, messages: list[dict]) -> list[dict]:
    """The task and a summary of the work so far, in place of the whole history."""
    ask = {"role": "user", "content": "Summarize the work so far in one paragraph."}
    reply = client.chat.completions.create(model=model, messages=[*messages, ask], tools=TOOLS)
    summary = reply.choices[0].message.content or ""
    return [*messages[:2], {"role": "user", "content": f"Summary of earlier work: {summary}"}]


def main() -> None:
    ap = argparse.ArgumentParser(description="A ReAct coding agent on the OpenAI API.")
    ap.add_argument("--context-budget", type=int, default=1500, help="prompt tokens")
    ap.add_argument("--max-turns", type=int, default=30)
    args = ap.parse_args()
    folder = Path(os.environ.get("GYRE_TASK_DIR") or ".").resolve()
    model = os.environ.get("GYRE_MODEL", "gyre-policy")
    client = openai.OpenAI(max_retries=0)
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": os.environ.get("GYRE_TASK_PROMPT", "Make the tests pass.")},
    ]
    try:
        for _ in range(args.max_turns):
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            msg = reply.choices[0].message
            turn: dict = {"role": "assistant", "content": msg.content or ""}
            if msg.tool_calls:
                turn["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
            messages.append(turn)
            if not msg.tool_calls:
                if "DONE" in (msg.content or ""):
                    return
                nudge = "Use a tool, or reply DONE when the task is complete."
                messages.append({"role": "user", "content": nudge})
            for call in msg.tool_calls or []:
                result = use_tool(folder, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if reply.usage is not None and reply.usage.prompt_tokens > args.context_budget:
                messages = compact(client, model, messages)
    except openai.RateLimitError:
        return  # the session's budget is spent: the run scores what is in the folder


if __name__ == "__main__":
    main()
