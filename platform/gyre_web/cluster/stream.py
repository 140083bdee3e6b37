"""The websocket's ``cluster`` stream: the cluster event log (``ClusterEvent``) after a
cursor, then live. The run-events consumer hands it the messages that name
``"stream": "cluster"``:

Client -> server: ``{"type": "subscribe", "stream": "cluster", "after": SEQ}`` and
``{"type": "unsubscribe", "stream": "cluster"}``. Server -> client:
``{"type": "subscribed", "stream": "cluster", "after": SEQ}``, then
``{"type": "events", "stream": "cluster", "events": [{"seq", "kind", "wall", "data"}]}``,
or ``{"type": "error", "stream": "cluster", "error": ...}``.

Like a run subscription, it reads the table after its cursor, sends what it found and
waits for a wake-up from the ``cluster`` channel group (service mode) or the poll
interval (embedded mode, and as a safety net), so nothing is missed or reordered.
Readable by every signed-in user (as the GPU inventory is); not through a share link.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from gyre_web.cluster.kinds import GROUP
from gyre_web.cluster.selectors import cluster_events_after

BATCH = 500  # events per message at most
STREAM = GROUP  # the stream's name in messages


@database_sync_to_async
def _events(after: int) -> list[dict[str, Any]]:
    return cluster_events_after(after=after, limit=BATCH)


class ClusterStream:
    """One websocket's subscription to the cluster stream (at most one at a time)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()

    async def receive(self, content: dict[str, Any]) -> None:
        kind = content.get("type")
        if kind == "unsubscribe":
            await self.stop()
            return
        if kind != "subscribe":
            await self._error("expected {type: subscribe|unsubscribe, stream: cluster}")
            return
        after = content.get("after", content.get("after_seq", 0))
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= 2**62:
            await self._error("after: a seq >= 0")
            return
        scope = self.consumer.scope
        user = scope.get("user")
        if scope.get("share_link") is not None or not getattr(user, "is_authenticated", False):
            await self._error("the cluster stream needs a signed-in user, not a share link")
            return
        await self.stop()
        layer = self.consumer.channel_layer
        if layer is not None:
            await layer.group_add(GROUP, self.consumer.channel_name)
        await self.consumer.send_json({"type": "subscribed", "stream": STREAM, "after": after})
        self.wake = asyncio.Event()
        self.task = asyncio.create_task(self._follow(after, self.wake))

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        layer = self.consumer.channel_layer
        if layer is not None:
            await layer.group_discard(GROUP, self.consumer.channel_name)

    def woken(self) -> None:
        """A ``cluster.events`` wake-up from the channel layer (sent after a commit)."""
        self.wake.set()

    async def _error(self, error: str) -> None:
        await self.consumer.send_json({"type": "error", "stream": STREAM, "error": error})

    async def _follow(self, after: int, wake: asyncio.Event) -> None:
        poll = float(settings.GYRE_EVENT_POLL_SECONDS)
        while True:
            wake.clear()
            events = await _events(after)
            if events and not await self.consumer.may_send(None):  # (realtime/consumers.py)
                events = []  # the consumer's guard closes the socket meanwhile
            elif events:
                await self.consumer.send_json(
                    {"type": "events", "stream": STREAM, "events": events}
                )
                after = events[-1]["seq"]
                if len(events) == BATCH:
                    continue  # more waiting in the table
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=poll)
