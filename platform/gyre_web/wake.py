"""Channel-layer wake-ups sent from a thread of their own, so a caller (the worker's sink,
a service after its commit) never waits on Redis. ``async_to_sync(group_send)`` from a plain thread starts an event loop (and with
channels_redis a new connection) on every call: 4-8 ms a flush on a loaded machine, with
tails past 100 ms. Here one long-lived loop per process owns the layer's connections and
sends the wake-ups one after the other, in the order they were queued."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


class Waker:
    _instance: Waker | None = None
    _guard = threading.Lock()

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] | None = None
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(ready,), name="gyre-wake", daemon=True
        )
        self.thread.start()
        ready.wait()

    @classmethod
    def of(cls, layer: Any) -> Waker:
        """The process's waker for ``layer`` (a new one after a fork)."""
        with cls._guard:
            w = cls._instance
            if w is None or w.layer is not layer or w.pid != os.getpid():
                w = cls._instance = cls(layer)
                atexit.register(w.drain)
            return w

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.queue = asyncio.Queue()
        ready.set()
        self.loop.run_until_complete(self._send_all())

    async def _send_all(self) -> None:
        assert self.queue is not None
        while (item := await self.queue.get()) is not None:
            try:
                await self.layer.group_send(*item)
            except Exception:  # a lost wake-up only delays: consumers also poll the table
                log.exception("channel-layer wake-up failed")
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def send(self, group: str, message: dict[str, Any]) -> None:
        assert self.queue is not None
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (group, message))

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until every queued wake-up has gone out (at exit, and for tests)."""
        if self.queue is None or not self.thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self.queue.join(), self.loop)
        try:
            future.result(timeout)
        except Exception:  # best effort at exit
            log.warning("channel-layer wake-ups still queued after %.1f s", timeout)


def wake(group: str, message: dict[str, Any]) -> None:
    """Queue ``message`` for the channel group ``group`` (nothing without a channel layer:
    consumers also poll the event tables, so a lost wake-up only delays)."""
    layer = get_channel_layer()
    if layer is not None:
        Waker.of(layer).send(group, message)
