"""The websocket fan-out through a shared RunFeed: several subscribers of one run, one of
them behind the feed's memory window, all receive every event once and in order."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from gyre_web.asgi import application
from gyre_web.realtime import consumers
from gyre_web.runs import services
from gyre_web.teams import services as teams

from gyre_core.events import RolloutStarted
from workers.sink import DbSink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = [(b"origin", b"http://localhost")]


def _emit(run_id: int, count: int) -> None:
    sink = DbSink(run_id, batch=1000, interval=3600)
    for i in range(count):
        sink.emit(RolloutStarted(t=float(i), rollout_id=f"r{i}", task_id="t", group_id="g",
                                 step=0))  # fmt: skip
    sink.flush()


async def _subscribe(key: str, run_id: int, after: int) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, f"/ws/?token={key}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "subscribe", "run": run_id, "after": after})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    return comm


async def _collect(comm: WebsocketCommunicator, upto: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < upto:
        msg = await comm.receive_json_from(timeout=5)
        if msg["type"] == "events":
            seqs += [e["seq"] for e in msg["events"]]
    return seqs


async def test_subscribers_share_a_feed_and_one_behind_its_window_reads_the_table(
    people, sim_config, monkeypatch
):
    monkeypatch.setattr(consumers, "WINDOW", 3)
    exp = await sync_to_async(services.create_experiment)(team=people["team"], name="feed")
    run = await sync_to_async(services.create_run)(experiment=exp, config=sim_config, launch=False)
    _, key = await sync_to_async(teams.create_api_token)(user=people["member"], name="f")
    comms = [await _subscribe(key, run.pk, 0) for _ in range(3)]
    await sync_to_async(_emit)(run.pk, 4)
    for comm in comms:
        assert await _collect(comm, 4) == [1, 2, 3, 4]
    assert consumers.RunFeed.feeds[run.pk].users == 3
    await sync_to_async(_emit)(run.pk, 4)  # 5..8; the window keeps only 6..8
    late = await _subscribe(key, run.pk, 2)
    assert await _collect(late, 8) == [3, 4, 5, 6, 7, 8]
    for comm in comms:
        assert await _collect(comm, 8) == [5, 6, 7, 8]
    await sync_to_async(_emit)(run.pk, 2)  # live again for everyone
    for comm in [*comms, late]:
        assert await _collect(comm, 10) == [9, 10]
        await comm.disconnect()
    assert run.pk not in consumers.RunFeed.feeds  # the last subscriber closed it
