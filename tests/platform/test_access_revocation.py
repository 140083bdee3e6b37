"""Revocation reaches open sockets: after a token is revoked, a member removed, a share link
revoked or a team deleted, REST refuses at once and a websocket subscribed before stops
receiving events — closed (4401, after an error naming the reason) when its credentials
no longer hold, unsubscribed (with the reason) when its run is no longer readable.

With the Redis channel layer the services' ``access.changed`` notice does it (the re-check
interval is set far longer than the test waits); without a channel layer (embedded mode)
the interval re-check does."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from gyre_web.asgi import application
from gyre_web.runs import services
from gyre_web.teams import services as teams
from rest_framework.test import APIClient

from gyre_core.events import StepFinished
from workers.sink import DbSink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = [(b"origin", b"http://localhost")]


def _event(step: int) -> dict[str, Any]:
    return {
        "kind": "step_finished",
        "t": float(step),
        "data": {"step": step, "version": 1, "metrics": {"loss": 1.0}},
    }


def _emit(run_id: int, step: int) -> None:
    """As a worker does: committed rows, then the channel-layer wake-up."""
    sink = DbSink(run_id, batch=10, interval=3600)
    sink.emit(StepFinished(t=float(step), step=step, version=1, metrics={"loss": 1.0}))
    sink.flush()


@pytest.fixture
def world(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="live")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    services.append_events(run_id=run.pk, events=[_event(1)])
    keys, tokens = {}, {}
    for who in ("admin", "member", "viewer"):
        tokens[who], keys[who] = teams.create_api_token(user=people[who], name="ws")
    link, keys["share"] = teams.create_share_link(created_by=people["owner"], experiment=exp)
    owner = APIClient()
    owner.force_authenticate(people["owner"])
    member = APIClient()
    member.force_authenticate(people["member"])
    return {
        "run": run,
        "keys": keys,
        "tokens": tokens,
        "link": link,
        "team": people["team"],
        "owner": owner,
        "member": member,
    }


async def _subscribed(w: dict[str, Any], who: str) -> WebsocketCommunicator:
    kind = "share" if who == "share" else "token"
    comm = WebsocketCommunicator(application, f"/ws/?{kind}={w['keys'][who]}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected, who
    await comm.send_json_to({"type": "subscribe", "run": w["run"].pk})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    events = await comm.receive_json_from(timeout=5)
    assert [e["seq"] for e in events["events"]] == [1], who
    return comm


async def _next(comm: WebsocketCommunicator, timeout: float = 3.0) -> dict[str, Any]:
    """The next message, or the close frame as {"close": CODE}."""
    out = await comm.receive_output(timeout)
    if out["type"] == "websocket.close":
        return {"close": out.get("code")}
    return json.loads(out["text"])


async def _closed_with(comm: WebsocketCommunicator, reason: str) -> float:
    started = time.monotonic()
    error = await _next(comm)
    assert error["type"] == "error" and error["reason"] == reason, error
    assert await _next(comm) == {"close": 4401}
    return time.monotonic() - started


async def _rest(client: APIClient, method: str, url: str, **extra: Any) -> int:
    resp = await sync_to_async(getattr(client, method))(url, **extra)
    return resp.status_code


async def _revocations_reach_sockets(w: dict[str, Any], deadline: float) -> None:
    run_id, team_id = w["run"].pk, w["team"].pk
    socks = {who: await _subscribed(w, who) for who in ("admin", "member", "viewer", "share")}

    # An API token revoked: REST 401 at once, its socket closed.
    url = f"/api/tokens/{w['tokens']['member'].pk}/"
    assert await _rest(w["member"], "delete", url) == 204
    script = APIClient(HTTP_AUTHORIZATION=f"Token {w['keys']['member']}")
    assert await _rest(script, "get", f"/api/runs/{run_id}/") == 401
    assert await _closed_with(socks["member"], "token_revoked") < deadline

    # A member removed: REST 404 at once, the subscription ends; the socket stays open.
    url = f"/api/teams/{team_id}/members/viewer/"
    assert await _rest(w["owner"], "delete", url) == 204
    viewer = APIClient(HTTP_AUTHORIZATION=f"Token {w['keys']['viewer']}")
    assert await _rest(viewer, "get", f"/api/runs/{run_id}/") == 404
    gone = {"type": "unsubscribed", "run": run_id, "reason": "access_revoked"}
    assert await _next(socks["viewer"]) == gone

    # A share link revoked: REST 401 at once, its socket closed.
    assert await _rest(w["owner"], "delete", f"/api/share-links/{w['link'].pk}/") == 204
    shared = APIClient(HTTP_X_GYRE_SHARE=w["keys"]["share"])
    assert await _rest(shared, "get", f"/api/runs/{run_id}/") == 401
    assert await _closed_with(socks["share"], "share_link_revoked") < deadline

    # New events reach only the admin, still a member; the viewer's socket gets nothing.
    await sync_to_async(_emit)(run_id, 2)
    assert [e["seq"] for e in (await _next(socks["admin"]))["events"]] == [2]
    assert await socks["viewer"].receive_nothing(timeout=0.3)

    # The team deleted: its runs with it; the admin's subscription ends.
    assert await _rest(w["owner"], "delete", f"/api/teams/{team_id}/") == 204
    assert await _next(socks["admin"]) == gone
    for comm in socks.values():
        await comm.disconnect()
    await sync_to_async(connections.close_all)()  # the fixture's connection (this context)


async def test_revocations_reach_open_sockets_by_the_channel_layer_notice(world, settings):
    settings.GYRE_WS_RECHECK_SECONDS = 60.0  # only the notice can be that quick
    await _revocations_reach_sockets(world, deadline=2.0)


async def test_revocations_reach_open_sockets_by_the_recheck_interval(world, settings):
    settings.CHANNEL_LAYERS = {}  # embedded mode: no notice, only the interval
    settings.GYRE_EVENT_POLL_SECONDS = 0.05
    settings.GYRE_WS_RECHECK_SECONDS = 0.3
    await _revocations_reach_sockets(world, deadline=2.0)
