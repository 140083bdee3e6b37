"""Agents the runtime tests name by import path (``rollout.agent``)."""

from __future__ import annotations

from gyre_core.rollout.external import AgentTask


async def varied(task: AgentTask) -> None:
    """A chat agent whose sessions differ in length by seed (1 to 10 calls), so that some
    finish while others are mid-call when the scheduler moves units."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(1 + task.seed % 10):
        r = await client.chat.completions.create(model=task.model, messages=messages)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content or ""},
            {"role": "user", "content": "Go on."},
        ]
