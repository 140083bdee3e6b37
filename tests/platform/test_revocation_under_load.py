"""Without a channel layer (embedded mode, or Postgres without Redis) no notice reaches an
open socket when its token is revoked. A subscription re-checks the credentials before it
sends a batch when the last check is older than ``consumers.SEND_CHECK`` (0.5 s), so a busy
run's events stop within a second while other sockets keep the database thread busy, not
only at the next periodic re-check (``GYRE_WS_RECHECK_SECONDS``, 5 s by default)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection, connections
from gyre_web.asgi import application
from gyre_web.runs import services
from gyre_web.teams import services as teams

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = [(b"origin", b"http://localhost")]
WATCHERS = 8  # other sockets reading the same run, each from its own cursor
GRACE = 1.0  # seconds after the revocation in which events may still arrive
WATCH = 4.0  # seconds after the grace in which none may


def _events(first: int, n: int) -> list[dict[str, Any]]:
    data = {"rollout": 0, "reward": 0.5, "text": "x" * 200}
    return [{"kind": "rollout_finished", "t": float(first + i), "data": data} for i in range(n)]


def _writer(run_id: int, stop: threading.Event) -> None:
    """A busy run: 100 events every 20 ms until stopped."""
    try:
        while not stop.is_set():
            services.append_events(run_id=run_id, events=_events(0, 100))
            time.sleep(0.02)
    finally:
        connection.close()


async def _subscribe(key: str, run_id: int, after: int) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, f"/ws/?token={key}", headers=ORIGIN)
    connected, _ = await comm.connect(timeout=10)
    assert connected
    await comm.send_json_to({"type": "subscribe", "run": run_id, "after": after})
    return comm


async def _drain(comm: WebsocketCommunicator, log: list[tuple[float, int]]) -> int | None:
    """Records (receive time, events in the message) until the socket closes; its code."""
    while True:
        out = await comm.receive_output(timeout=60)
        if out["type"] == "websocket.close":
            return out.get("code")
        text = out.get("text") or ""
        if text.startswith('{"type": "events"'):
            log.append((time.monotonic(), text.count('"seq"')))


async def test_a_revoked_token_gets_no_events_after_a_grace_under_load(
    people, sim_config, settings
):
    settings.CHANNEL_LAYERS = {}  # no notice: only the re-checks can close the socket
    settings.GYRE_EVENT_POLL_SECONDS = 0.05
    settings.GYRE_WS_RECHECK_SECONDS = 5.0  # the default: the periodic re-check alone is late
    exp = await sync_to_async(services.create_experiment)(team=people["team"], name="busy")
    run = await sync_to_async(services.create_run)(experiment=exp, config=sim_config, launch=False)
    for first in range(0, 5_000, 1_000):  # a backlog the watchers read in batches
        await sync_to_async(services.append_events)(run_id=run.pk, events=_events(first, 1_000))
    token, key = await sync_to_async(teams.create_api_token)(user=people["member"], name="ws")
    _, watcher_key = await sync_to_async(teams.create_api_token)(user=people["admin"], name="w")

    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(run.pk, stop), daemon=True)
    writer.start()
    watchers = [await _subscribe(watcher_key, run.pk, after=i * 400) for i in range(WATCHERS)]
    drains = [asyncio.create_task(_drain(c, [])) for c in watchers]
    victim = await _subscribe(key, run.pk, after=4_900)
    received: list[tuple[float, int]] = []
    victim_drain = asyncio.create_task(_drain(victim, received))
    try:
        for _ in range(200):  # until the victim receives the busy run's events
            await asyncio.sleep(0.1)
            if received:
                break
        assert received, "the victim got no events before the revocation"
        await sync_to_async(teams.revoke_api_token)(token=token)
        revoked = time.monotonic()
        done, _ = await asyncio.wait({victim_drain}, timeout=GRACE + WATCH)
        late = sum(n for at, n in received if at > revoked + GRACE)
        assert late == 0, f"{late} events reached a revoked token more than {GRACE} s after"
        assert done and victim_drain.result() == 4401, "the socket was not closed"
    finally:
        stop.set()
        await sync_to_async(writer.join)(10)
        for task in [*drains, victim_drain]:
            task.cancel()
        for comm in [*watchers, victim]:
            await comm.disconnect()
        await sync_to_async(connections.close_all)()
