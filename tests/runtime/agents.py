"""Agents the runtime tests name by import path (``rollout.agent``)."""

from __future__ import annotations

from gyre_core.rollout.external import AgentTask


async def varied(task: AgentTask) -> None:
    """A chat agent whose sessions differ in length by seed: one call for an even seed, six
    for an odd one, so that a batch is ready while the long sessions are mid-call."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(1 if task.seed % 2 == 0 else 6):
        r = await client.chat.completions.create(model=task.model, messages=messages)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content or ""},
            {"role": "user", "content": "Go on."},
        ]
