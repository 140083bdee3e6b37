"""The one websocket consumer: multiplexed run subscriptions that resume from a cursor.

Client -> server: ``{"type": "subscribe", "run": ID, "after": SEQ}`` (``after_seq`` also
accepted) and ``{"type": "unsubscribe", "run": ID}``. Server -> client:
``{"type": "events", "run": ID, "events": [{"seq", "kind", "t", "wall", "data"}, ...]}``,
``{"type": "subscribed", "run": ID, "after": SEQ}`` and ``{"type": "error", ...}``.

The event table is the source of truth: each subscription reads the events after its
cursor, sends them, and waits — for a wake-up from the channel layer (service mode) or
the poll interval (embedded mode, or as a safety net) — then reads again. So a
subscriber never misses or reorders an event, however the wake-ups arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from gyre_web.runs import selectors

BATCH = 500  # events per message at most


def group_name(run_id: int) -> str:
    return f"run-{run_id}"


@database_sync_to_async
def _can_read(user: Any, link: Any, run_id: int) -> bool:
    return selectors.runs_visible(user, link).filter(pk=run_id).exists()


@database_sync_to_async
def _events(run_id: int, after: int) -> list[dict[str, Any]]:
    return [e.as_message() for e in selectors.events_after(run_id=run_id, after=after, limit=BATCH)]


class RunEventsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        self.subs: dict[int, asyncio.Task[None]] = {}
        self.wake: dict[int, asyncio.Event] = {}
        user, link = self.scope.get("user"), self.scope.get("share_link")
        if link is None and not getattr(user, "is_authenticated", False):
            await self.close(code=4401)
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for run_id in list(getattr(self, "subs", {})):
            await self._unsubscribe(run_id)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "error": "send a JSON object"})
            return
        kind, run = content.get("type"), content.get("run")
        if kind not in ("subscribe", "unsubscribe") or not isinstance(run, int):
            await self.send_json(
                {"type": "error", "error": "expected {type: subscribe|unsubscribe, run: ID}"}
            )
            return
        if kind == "unsubscribe":
            await self._unsubscribe(run)
            return
        after = content.get("after", content.get("after_seq", 0))
        if not isinstance(after, int) or after < 0:
            await self.send_json({"type": "error", "run": run, "error": "after: a seq >= 0"})
            return
        if not await _can_read(self.scope.get("user"), self.scope.get("share_link"), run):
            await self.send_json({"type": "error", "run": run, "error": "run not found"})
            return
        await self._unsubscribe(run)
        self.wake[run] = asyncio.Event()
        if self.channel_layer is not None:
            await self.channel_layer.group_add(group_name(run), self.channel_name)
        await self.send_json({"type": "subscribed", "run": run, "after": after})
        self.subs[run] = asyncio.create_task(self._follow(run, after))

    async def _unsubscribe(self, run_id: int) -> None:
        task = self.subs.pop(run_id, None)
        self.wake.pop(run_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if self.channel_layer is not None:
                await self.channel_layer.group_discard(group_name(run_id), self.channel_name)

    async def _follow(self, run_id: int, after: int) -> None:
        poll = float(settings.GYRE_EVENT_POLL_SECONDS)
        while True:
            wake = self.wake.get(run_id)
            if wake is None:
                return
            wake.clear()
            events = await _events(run_id, after)
            if events:
                after = events[-1]["seq"]
                await self.send_json({"type": "events", "run": run_id, "events": events})
                if len(events) == BATCH:
                    continue  # more waiting in the table
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=poll)

    async def run_events(self, message: dict[str, Any]) -> None:
        """Channel-layer wake-up sent by the worker's sink after it commits events."""
        wake = self.wake.get(int(message["run"]))
        if wake is not None:
            wake.set()
