"""The one websocket consumer: multiplexed run subscriptions that resume from a cursor.

Client -> server: ``{"type": "subscribe", "run": ID, "after": SEQ}`` (``after_seq`` also
accepted) and ``{"type": "unsubscribe", "run": ID}``. Server -> client:
``{"type": "events", "run": ID, "events": [{"seq", "kind", "t", "wall", "data"}, ...]}``,
``{"type": "subscribed", "run": ID, "after": SEQ}`` and ``{"type": "error", ...}``.
A message that names ``"stream": "cluster"`` is the cluster event log's instead
(``gyre_web.cluster.stream``).

The event table is the source of truth: each subscription reads the events after its
cursor, sends them, and waits — for a wake-up from the channel layer (service mode) or
the poll interval (embedded mode, or as a safety net) — then reads again. So a
subscriber never misses or reorders an event, however the wake-ups arrive.

Access is re-checked while a socket stays open: when credentials or memberships change
(the teams services send ``access.changed`` to the ``access`` group on commit) and every
``GYRE_WS_RECHECK_SECONDS`` (embedded mode, and a lost notice), and before a batch of
events is sent when the last check is older than ``SEND_CHECK``. Credentials that no
longer hold close the socket after ``{"type": "error", "error": MESSAGE, "reason":
REASON}`` (``LOST``): code 4401 for a revoked API token or share link or an ended
session, 4403 for a deactivated user. A subscription whose run is no longer readable gets ``{"type": "unsubscribed", "run": ID,
"reason": "access_revoked"}`` and stops.

Many clients usually watch one run. A :class:`RunFeed` per run and process takes each new
batch from its wake-up (the sink sends the committed rows along) or else reads it from the
table once for all of them (the wake-up names the newest ``seq``), and keeps the recent
events in memory; a subscriber whose cursor is older than that window, or a
poll without a wake-up, reads the table itself. Database calls run one at a time in
Channels, so one query per client per batch would queue up behind each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from gyre_core.jsonl import JsonBoundsError, loads
from gyre_web.cluster.stream import STREAM as CLUSTER_STREAM
from gyre_web.cluster.stream import ClusterStream
from gyre_web.realtime.groups import group_name
from gyre_web.runs import selectors
from gyre_web.teams import selectors as team_selectors
from gyre_web.teams.services import ACCESS_GROUP

log = logging.getLogger(__name__)
BATCH = 500  # events per message at most
WINDOW = 5000  # recent events a RunFeed keeps in memory (a few seconds of a busy run)
MAX_MESSAGE = 64 * 1024  # characters of one client message (a subscribe is ~50)
MAX_DEPTH = 4  # a client message is flat; the bound keeps a nested one cheap to refuse
MAX_ID = 2**62  # run ids and cursors beyond this cannot exist (bigint columns)


def _is_id(value: Any, lo: int) -> bool:
    """An integer in [lo, MAX_ID] that is not a bool (``True`` is the int 1 in Python)."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= MAX_ID


OUTAGE_POLL = 0.5  # seconds between table reads while the channel layer cannot wake us
# A batch of events goes out only on credentials checked at most this long ago (or
# GYRE_WS_RECHECK_SECONDS, if shorter): without a channel layer no notice comes, and the
# periodic re-check can wait behind the other sockets' reads on the one database thread.
SEND_CHECK = 0.5


LOST = {  # reason -> (message, close code)
    "token_revoked": ("the API token was revoked", 4401),
    "share_link_revoked": ("the share link was revoked", 4401),
    "signed_out": ("the session ended", 4401),
    "user_inactive": ("the account is deactivated", 4403),
}


def _credentials_lost(scope: dict[str, Any]) -> str | None:
    user, link, session = scope.get("user"), scope.get("share_link"), scope.get("session")
    return team_selectors.credentials_lost(
        token_id=scope.get("api_token"),
        link_id=link.pk if link is not None else None,
        user_id=getattr(user, "pk", None),
        session_key=getattr(session, "session_key", None) if session is not None else None,
    )


@database_sync_to_async
def _can_read(scope: dict[str, Any], run_id: int) -> bool:
    if _credentials_lost(scope) is not None:
        return False
    user, link = scope.get("user"), scope.get("share_link")
    return selectors.runs_visible(user, link).filter(pk=run_id).exists()


@database_sync_to_async
def _recheck(scope: dict[str, Any], run_ids: list[int]) -> tuple[str | None, list[int]]:
    """(why the credentials are lost, or None; the subscribed runs no longer readable)."""
    lost = _credentials_lost(scope)
    if lost is not None or not run_ids:
        return lost, []
    readable = selectors.runs_visible(scope.get("user"), scope.get("share_link"))
    still = set(readable.filter(pk__in=run_ids).values_list("pk", flat=True))
    return None, [r for r in run_ids if r not in still]


@database_sync_to_async
def _events(run_id: int, after: int) -> list[dict[str, Any]]:
    return [e.as_message() for e in selectors.events_after(run_id=run_id, after=after, limit=BATCH)]


class RunFeed:
    """The recent events of one run, read once per wake-up for every subscriber in this
    process: ``cache`` holds contiguous events up to the newest one read; ``latest`` is
    the newest ``seq`` a wake-up announced."""

    feeds: dict[int, RunFeed] = {}

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.cache: list[dict[str, Any]] = []
        self.latest = 0
        self.users = 0
        self.lock = asyncio.Lock()
        self.texts: dict[tuple[int, int], str] = {}

    @classmethod
    def join(cls, run_id: int) -> RunFeed:
        feed = cls.feeds.setdefault(run_id, cls(run_id))
        feed.users += 1
        return feed

    def leave(self) -> None:
        self.users -= 1
        if self.users <= 0 and self.feeds.get(self.run_id) is self:
            del self.feeds[self.run_id]

    def _top(self) -> int:
        return self.cache[-1]["seq"] if self.cache else 0

    def _covers(self, after: int) -> bool:
        return bool(self.cache) and self.cache[0]["seq"] <= after + 1

    def _slice(self, after: int) -> list[dict[str, Any]]:
        start = after + 1 - self.cache[0]["seq"]
        return self.cache[start : start + BATCH]

    async def after(self, after: int) -> list[dict[str, Any]]:
        """Events after ``after`` (at most BATCH), from memory when the window holds them."""
        if self._covers(after) and self._top() >= self.latest:
            return self._slice(after)
        async with self.lock:  # the first subscriber reads; the others find it in memory
            if self._top() < self.latest and (self._covers(after) or after >= self._top()):
                base = self._top() if self.cache else after
                fresh = await _events(self.run_id, base)
                if fresh and (not self.cache or fresh[0]["seq"] == self._top() + 1):
                    self.cache = (self.cache + fresh)[-WINDOW:]
            if self._covers(after):
                return self._slice(after)
        return await _events(self.run_id, after)  # behind the window: the table itself

    def encode(self, after: int, message: dict[str, Any]) -> str:
        """The JSON text of an events message, encoded once per (cursor, last seq)."""
        key = (after, message["events"][-1]["seq"])
        text = self.texts.get(key)
        if text is None:
            if len(self.texts) >= 64:
                self.texts.clear()
            text = self.texts[key] = json.dumps(message)
        return text

    def announce(self, last_seq: int) -> None:
        self.latest = max(self.latest, last_seq)

    def offer(self, events: list[dict[str, Any]]) -> None:
        """A committed batch carried by its wake-up: kept when it continues the cache (or
        starts it), else ignored, so the cache stays contiguous and a gap is read from the
        table as before."""
        if events and (not self.cache or events[0]["seq"] == self._top() + 1):
            self.cache = (self.cache + events)[-WINDOW:]


class RunEventsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        self.subs: dict[int, asyncio.Task[None]] = {}
        self.wake: dict[int, asyncio.Event] = {}
        self.feeds: dict[int, RunFeed] = {}
        self.cluster = ClusterStream(self)
        user, link = self.scope.get("user"), self.scope.get("share_link")
        self.access = asyncio.Event()
        self.guard: asyncio.Task[None] | None = None
        self.checked_at = asyncio.get_running_loop().time()  # connect checked them
        self.check_lock = asyncio.Lock()
        if link is None and not getattr(user, "is_authenticated", False):
            await self.close(code=4401)
            return
        await self.accept()
        if self.channel_layer is not None:
            await self.channel_layer.group_add(ACCESS_GROUP, self.channel_name)
        self.guard = asyncio.create_task(self._guard())

    async def disconnect(self, code: int) -> None:
        guard = getattr(self, "guard", None)
        if guard is not None and guard is not asyncio.current_task():
            guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await guard
        if guard is not None and self.channel_layer is not None:
            await self.channel_layer.group_discard(ACCESS_GROUP, self.channel_name)
        await self._stop_all()

    async def _stop_all(self) -> None:
        for run_id in list(getattr(self, "subs", {})):
            await self._unsubscribe(run_id)
        if hasattr(self, "cluster"):
            await self.cluster.stop()

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """The edge: a frame that is not one bounded JSON text message is answered with an
        error and the socket stays open (the default raises, and Channels closes 1011)."""
        if text_data is None:
            await self.send_json({"type": "error", "error": "send JSON text frames, not binary"})
            return
        if len(text_data) > MAX_MESSAGE:
            await self.send_json(
                {"type": "error", "error": f"a message is at most {MAX_MESSAGE} characters"}
            )
            return
        try:
            content = await self.decode_json(text_data)
        except JsonBoundsError as exc:
            await self.send_json({"type": "error", "error": f"not a message: {exc.problem}"})
            return
        await self.receive_json(content, **kwargs)

    @classmethod
    async def decode_json(cls, text_data: str) -> Any:
        return loads(text_data, max_depth=MAX_DEPTH)

    async def access_changed(self, message: dict[str, Any]) -> None:
        """Channel-layer notice sent after credentials or memberships changed."""
        self.access.set()

    async def _guard(self) -> None:
        """Re-check access on each notice and every GYRE_WS_RECHECK_SECONDS."""
        interval = max(0.05, float(settings.GYRE_WS_RECHECK_SECONDS))
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.access.wait(), timeout=interval)
            self.access.clear()
            started = asyncio.get_running_loop().time()
            try:
                lost, unreadable = await _recheck(self.scope, list(self.subs))
            except Exception:  # the database away: keep the socket, try again later
                log.exception("websocket access re-check failed")
                continue
            if lost is None:
                self.checked_at = max(self.checked_at, started)
            if lost is not None:
                await self._stop_all()  # no event goes out after the error
                message, code = LOST[lost]
                await self.send_json({"type": "error", "error": message, "reason": lost})
                await self.close(code=code)
                return
            for run_id in unreadable:
                if run_id in self.subs:
                    await self._unsubscribe(run_id)
                    await self.send_json(
                        {"type": "unsubscribed", "run": run_id, "reason": "access_revoked"}
                    )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "error": "send a JSON object"})
            return
        stream = content.get("stream")
        if stream is not None:
            if stream == CLUSTER_STREAM:
                await self.cluster.receive(content)
            else:
                await self.send_json({"type": "error", "error": f"no stream {stream!r}"})
            return
        kind, run = content.get("type"), content.get("run")
        if kind not in ("subscribe", "unsubscribe") or not _is_id(run, 1):
            await self.send_json(
                {"type": "error", "error": "expected {type: subscribe|unsubscribe, run: ID}"}
            )
            return
        if kind == "unsubscribe":
            await self._unsubscribe(run)
            return
        after = content.get("after", content.get("after_seq", 0))
        if not _is_id(after, 0):
            await self.send_json({"type": "error", "run": run, "error": "after: a seq >= 0"})
            return
        if not await _can_read(self.scope, run):
            await self.send_json({"type": "error", "run": run, "error": "run not found"})
            return
        await self._unsubscribe(run)
        self.wake[run] = asyncio.Event()
        self.feeds[run] = RunFeed.join(run)
        if self.channel_layer is not None:
            await self.channel_layer.group_add(group_name(run), self.channel_name)
        await self.send_json({"type": "subscribed", "run": run, "after": after})
        self.subs[run] = asyncio.create_task(self._follow(run, after))

    async def _unsubscribe(self, run_id: int) -> None:
        task = self.subs.pop(run_id, None)
        self.wake.pop(run_id, None)
        feed = self.feeds.pop(run_id, None)
        if feed is not None:
            feed.leave()
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
            woken = wake.is_set()
            wake.clear()
            feed = self.feeds.get(run_id)
            if woken and feed is not None:
                events = await feed.after(after)
            else:  # the first read, or a poll without a wake-up: the table itself
                events = await _events(run_id, after)
            if events and not await self.may_send(run_id):
                await self._wait(wake, poll)  # the guard closes or unsubscribes meanwhile
                continue  # (or, after a failed check, the next read checks again)
            if events:
                message = {"type": "events", "run": run_id, "events": events}
                if feed is not None:  # subscribers at one cursor share one encoding
                    await self.send(text_data=feed.encode(after, message))
                else:
                    await self.send_json(message)
                after = events[-1]["seq"]
                if len(events) == BATCH:
                    continue  # more waiting in the table
            await self._wait(wake, poll)

    async def may_send(self, run_id: int | None) -> bool:
        """Whether the credentials still hold and still read the subscribed runs, as checked
        within SEND_CHECK seconds (``run_id`` None: the cluster stream asks). A stale check
        is redone here, one at a time per socket; on a loss the guard is woken to close the
        socket or unsubscribe, and a run it ends gets nothing more. A failed check (the
        database away) sends nothing now."""
        loop = asyncio.get_running_loop()
        fresh = min(SEND_CHECK, max(0.05, float(settings.GYRE_WS_RECHECK_SECONDS)))
        async with self.check_lock:
            if loop.time() - self.checked_at <= fresh:
                return True
            started = loop.time()
            try:
                lost, unreadable = await _recheck(self.scope, list(self.subs))
            except Exception:
                log.exception("websocket access check before sending failed")
                return False
            if lost is None and not unreadable:
                self.checked_at = max(self.checked_at, started)
                return True
        self.access.set()
        return lost is None and run_id not in unreadable

    async def _wait(self, wake: asyncio.Event, poll: float) -> None:
        """Until a wake-up, or ``poll`` seconds; every OUTAGE_POLL seconds while the
        channel layer reports Redis down (``down_since``), since no wake-up comes then."""
        deadline = asyncio.get_running_loop().time() + poll
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=min(left, OUTAGE_POLL))
                return
            if getattr(self.channel_layer, "down_since", None) is not None:
                return

    async def run_events(self, message: dict[str, Any]) -> None:
        """Channel-layer wake-up sent by the worker's sink after it commits events."""
        run_id = int(message["run"])
        feed = self.feeds.get(run_id)
        if feed is not None and isinstance(message.get("events"), list):
            feed.offer(message["events"])  # the first subscriber here adds it for all
        if feed is not None and isinstance(message.get("last_seq"), int):
            feed.announce(message["last_seq"])
        wake = self.wake.get(run_id)
        if wake is not None:
            wake.set()

    async def cluster_events(self, message: dict[str, Any]) -> None:
        """Channel-layer wake-up sent after cluster events commit (``cluster.services``)."""
        self.cluster.woken()
