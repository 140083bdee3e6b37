"""The websocket consumer through the real ASGI app: replay after a cursor, then live
events — woken by the Redis channel layer (service mode) or by polling (embedded mode)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from gyre_web.asgi import application
from gyre_web.runs import services
from gyre_web.teams import services as teams

from gyre_core.events import RolloutStarted, StepFinished
from workers.sink import DbSink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = [(b"origin", b"http://localhost")]


@pytest.fixture
def setup(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="ws")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    _, viewer_key = teams.create_api_token(user=people["viewer"], name="ws")
    _, outsider_key = teams.create_api_token(user=people["outsider"], name="ws")
    return {"run": run, "viewer": viewer_key, "outsider": outsider_key}


def _emit(run_id: int, first_step: int, count: int) -> None:
    sink = DbSink(run_id, batch=1000, interval=3600)
    for i in range(count):
        sink.emit(RolloutStarted(t=float(i), rollout_id=f"r{first_step + i}", task_id="t",
                                 group_id="g", step=first_step))  # fmt: skip
    sink.emit(StepFinished(t=float(count), step=first_step, version=1, metrics={"loss": 1.0}))
    sink.flush()


async def _connect(query: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, f"/ws/?{query}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected
    return comm


async def _collect(comm: WebsocketCommunicator, upto: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < upto:
        msg = await comm.receive_json_from(timeout=5)
        if msg["type"] == "events":
            seqs += [e["seq"] for e in msg["events"]]
    return seqs


async def _replay_then_live(setup) -> None:
    run_id = setup["run"].pk
    await sync_to_async(_emit)(run_id, 1, 4)  # seq 1..5
    comm = await _connect(f"token={setup['viewer']}")
    await comm.send_json_to({"type": "subscribe", "run": run_id, "after": 2})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    assert await _collect(comm, 5) == [3, 4, 5]
    await sync_to_async(_emit)(run_id, 2, 2)  # seq 6..8, while subscribed
    assert await _collect(comm, 8) == [6, 7, 8]
    await comm.disconnect()


async def test_replay_then_live_with_the_redis_channel_layer(setup):
    await _replay_then_live(setup)


async def test_replay_then_live_by_polling_without_a_channel_layer(setup, settings):
    settings.CHANNEL_LAYERS = {}
    settings.GYRE_EVENT_POLL_SECONDS = 0.05
    await _replay_then_live(setup)


async def test_a_non_member_is_refused_and_anonymous_cannot_connect(setup):
    comm = await _connect(f"token={setup['outsider']}")
    await comm.send_json_to({"type": "subscribe", "run": setup["run"].pk, "after_seq": 0})
    msg = await comm.receive_json_from(timeout=5)
    assert msg == {"type": "error", "run": setup["run"].pk, "error": "run not found"}
    await comm.send_json_to({"type": "subscribe", "run": "x"})
    assert (await comm.receive_json_from(timeout=5))["type"] == "error"
    await comm.disconnect()
    anon = WebsocketCommunicator(application, "/ws/", headers=ORIGIN)
    connected, code = await anon.connect()
    assert not connected and code == 4401


async def test_a_share_link_subscribes_to_its_run(setup, people):
    _, key = await sync_to_async(teams.create_share_link)(
        created_by=people["owner"], run=setup["run"]
    )
    await sync_to_async(_emit)(setup["run"].pk, 1, 1)
    comm = await _connect(f"share={key}")
    await comm.send_json_to({"type": "subscribe", "run": setup["run"].pk})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    assert await _collect(comm, 2) == [1, 2]
    await comm.disconnect()
    await asyncio.sleep(0)
