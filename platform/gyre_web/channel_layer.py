"""The Redis channel layer, made to ride out a Redis outage.

The event table is the source of truth; the layer only wakes consumers sooner. So while
Redis is unreachable nothing here raises: ``receive`` retries with a backoff (the
consumer, and its socket, stay up and keep polling the table), and ``group_add``,
``group_discard`` and ``group_send`` log and carry on. The layer remembers the groups its
channels joined and joins them again once Redis answers (a restarted Redis has lost
them), so wake-ups resume by themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
UNREACHABLE = (RedisError, OSError)  # ConnectionError, TimeoutError, refused, reset
BACKOFF = (0.2, 5.0)  # the first retry of a receive, and the longest wait between retries


class ResilientRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.joined: dict[str, set[str]] = {}  # group -> channels of this process in it
        self.down_since: float | None = None  # monotonic; None while Redis answers
        self.rejoiner: asyncio.Task[None] | None = None

    def _lost(self, what: str, err: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("redis unreachable (%s: %s); consumers poll the event table", what, err)
        if self.rejoiner is None or self.rejoiner.done():
            self.rejoiner = asyncio.get_running_loop().create_task(self._rejoin_when_back())

    async def _rejoin_when_back(self) -> None:
        """Ping Redis with a backoff until it answers, then join the groups again."""
        wait = BACKOFF[0]
        while True:
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF[1])
            try:
                await self.connection(0).ping()
                for group, channels in list(self.joined.items()):
                    for channel in list(channels):
                        await super().group_add(group, channel)
            except UNREACHABLE:
                continue
            down = time.monotonic() - (self.down_since or time.monotonic())
            self.down_since = None
            n = len(self.joined)
            log.warning("redis is back after %.1f s; %d groups joined again", down, n)
            return

    async def receive(self, channel: str) -> Any:
        wait = BACKOFF[0]
        while True:
            try:
                return await super().receive(channel)
            except UNREACHABLE as err:
                self._lost("receive", err)
                await asyncio.sleep(wait)
                wait = min(wait * 2, BACKOFF[1])

    async def group_add(self, group: str, channel: str) -> None:
        self.joined.setdefault(group, set()).add(channel)
        try:
            await super().group_add(group, channel)
        except UNREACHABLE as err:
            self._lost("group_add", err)  # joined again once Redis is back

    async def group_discard(self, group: str, channel: str) -> None:
        channels = self.joined.get(group)
        if channels is not None:
            channels.discard(channel)
            if not channels:
                del self.joined[group]
        try:
            await super().group_discard(group, channel)
        except UNREACHABLE as err:
            self._lost("group_discard", err)  # the membership expires (group_expiry)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        try:
            await super().group_send(group, message)
        except UNREACHABLE as err:
            self._lost("group_send", err)  # a lost wake-up only delays: consumers poll
