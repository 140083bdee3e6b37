"""Hostile websocket frames through the real ASGI app: each is answered with an error
message and the socket stays open (no 1011 close); ``"run": true`` is not run 1."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator
from gyre_web.asgi import application
from gyre_web.runs import services
from gyre_web.teams import services as teams

# reset_sequences: the run below is run 1, which ``"run": true`` subscribed to before
pytestmark = [pytest.mark.django_db(transaction=True, reset_sequences=True), pytest.mark.asyncio]
ORIGIN = [(b"origin", b"http://localhost")]


@pytest.fixture
def setup(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="ws-hostile")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    _, key = teams.create_api_token(user=people["viewer"], name="ws")
    return {"run": run.pk, "key": key}


def _frames(run: int) -> list[tuple[str, dict[str, str | bytes]]]:
    sub = '{"type": "subscribe", "run": %d, "after": %s}'
    return [
        ("non-JSON text", {"text_data": "hello, not json"}),
        ("binary frame", {"bytes_data": b"\x00\x01binary"}),
        ("5,000-digit after", {"text_data": sub % (run, "1" + "0" * 5000)}),
        ("after beyond any seq", {"text_data": sub % (run, "1" + "0" * 40)}),
        ("nested 100,000 deep", {"text_data": "[" * 100_000 + "]" * 100_000}),
        (
            "nested object",
            {"text_data": '{"type": "subscribe", "run": ' + "[" * 50 + "]" * 50 + "}"},
        ),
        ("run true", {"text_data": json.dumps({"type": "subscribe", "run": True})}),
        ("run 2^70", {"text_data": json.dumps({"type": "subscribe", "run": 2**70})}),
        ("lone surrogate", {"text_data": json.dumps({"type": "subscribe", "stream": "\ud800"})}),
    ]


async def test_bad_frames_get_an_error_and_the_socket_stays_open(setup):
    run = setup["run"]
    assert run == 1
    comm = WebsocketCommunicator(application, f"/ws/?token={setup['key']}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected
    for name, frame in _frames(run):
        await comm.send_to(**frame)
        reply = json.loads(await comm.receive_from(timeout=5))
        assert reply["type"] == "error", (name, reply)
        assert isinstance(reply["error"], str) and reply["error"], name
    await comm.send_json_to({"type": "subscribe", "run": run, "after": 0})
    assert (await comm.receive_json_from(timeout=5)) == {
        "type": "subscribed",
        "run": run,
        "after": 0,
    }
    await comm.disconnect()
