"""A tool-using agent on the OpenAI API, as a user writes one: it imports only ``openai``
and the standard library. It asks, runs the ``read_file`` calls it gets in FOLDER, sends the
results back, and after the episode compacts its context to a summary and asks once more
(streamed). It prints what it saw as one JSON line.

    python openai_tool_agent.py BASE_URL FOLDER
"""

import json
import sys
from pathlib import Path

from openai import OpenAI

SYSTEM = "You are a careful agent."
TASK = "Task 1: read the task file."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the task folder.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def main() -> None:
    base_url, folder = sys.argv[1], Path(sys.argv[2])
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    seen = {"tool_calls": [], "replies": []}
    for _ in range(3):
        r = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        seen["replies"].append(msg.content)
        turn = {"role": "assistant", "content": msg.content}
        if msg.tool_calls:
            turn["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        messages.append(turn)
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            seen["tool_calls"].append([call.function.name, args])
            text = (folder / args["path"]).read_text()
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    summary = {"role": "user", "content": f"Summary of earlier work: {len(messages)} messages."}
    stream = client.chat.completions.create(
        model="policy", messages=[*messages[:2], summary], tools=TOOLS, stream=True
    )
    seen["streamed"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
