"""The cluster event log and its websocket stream: GPU leases and node flips append events
numbered contiguously from 1 (also under concurrent writers on Postgres); a signed-in
client replays them after its cursor, then receives live ones — woken by the Redis channel
layer or by polling without one; a share link is refused."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from gyre_web.asgi import application
from gyre_web.cluster import services as cluster
from gyre_web.cluster.kinds import GPU_LEASE, NODE_STATUS
from gyre_web.cluster.models import ClusterEvent
from gyre_web.runs import services
from gyre_web.teams import services as teams

from gyre_core.runtime.inventory import NodeRecord

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = [(b"origin", b"http://localhost")]


def _rec(node_id: str, name: str, alive: bool = True, gpu_units: int = 2) -> dict:
    return NodeRecord(node_id=node_id, name=name, hostname=name, address="10.0.0.1:1",
                      alive=alive, head=False, gpus=0, gpu_units=gpu_units,
                      accelerator="").to_dict()  # fmt: skip


def _log() -> list[tuple[int, str, dict]]:
    return list(ClusterEvent.objects.order_by("seq").values_list("seq", "kind", "data"))


@pytest.fixture
def setup(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="cluster")
    runs = [services.create_run(experiment=exp, config=sim_config, launch=False) for _ in "ab"]
    gpus = [cluster.register_gpu(node_name="n0", index=i) for i in range(3)]
    _, viewer_key = teams.create_api_token(user=people["viewer"], name="ws")
    _, outsider_key = teams.create_api_token(user=people["outsider"], name="ws")
    return {"runs": runs, "gpus": gpus, "viewer": viewer_key, "outsider": outsider_key}


def test_leases_and_node_flips_append_contiguous_events(setup):
    a, b = (r.pk for r in setup["runs"])
    g0, g1, g2 = setup["gpus"]
    cluster.lease_gpus(run_id=a, unit_index=0, gpus=[g0, g1])
    cluster.lease_gpus(run_id=a, unit_index=0, gpus=[g0, g1])  # held already: no event
    cluster.lease_gpus(run_id=a, unit_index=1, gpus=[g2])
    with pytest.raises(cluster.GpuBusy):
        cluster.lease_gpus(run_id=b, unit_index=0, gpus=[g2])  # rolled back: no event
    assert cluster.release_gpus(run_id=a) == 3
    assert cluster.release_gpus(run_id=a) == 0  # nothing held: no event
    assert _log() == [
        (1, GPU_LEASE, {"run": a, "unit": 0, "gpus": [g0.pk, g1.pk], "held": True}),
        (2, GPU_LEASE, {"run": a, "unit": 1, "gpus": [g2.pk], "held": True}),
        (3, GPU_LEASE, {"run": a, "unit": 0, "gpus": [g0.pk, g1.pk], "held": False}),
        (4, GPU_LEASE, {"run": a, "unit": 1, "gpus": [g2.pk], "held": False}),
    ]
    ClusterEvent.objects.all().delete()
    cluster.sync_inventory(nodes=[_rec("aa" * 28, "gpu-a"), _rec("bb" * 28, "gpu-b", gpu_units=1)])
    cluster.sync_inventory(nodes=[_rec("aa" * 28, "gpu-a"), _rec("bb" * 28, "gpu-b", gpu_units=1)])
    cluster.sync_inventory(nodes=[_rec("aa" * 28, "gpu-a", alive=False, gpu_units=0)])  # b unlisted
    cluster.sync_inventory(nodes=[_rec("bb" * 28, "gpu-b", gpu_units=1)])  # b back, a still gone
    names, gpus = {"aa": "gpu-a", "bb": "gpu-b"}, {"aa": 2, "bb": 1}
    flips = [(5, "aa", True), (6, "bb", True), (7, "aa", False), (8, "bb", False), (9, "bb", True)]
    assert _log() == [
        (seq, NODE_STATUS, {"node": names[k], "node_id": k * 28, "alive": up, "gpus": gpus[k]})
        for seq, k, up in flips
    ]


def test_concurrent_writers_get_contiguous_seqs():
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def write(w: int) -> None:
        try:
            start.wait()
            for i in range(15):
                status = {"node": f"w{w}", "node_id": str(i), "alive": True, "gpus": 0}
                cluster.append_cluster_events(events=[(NODE_STATUS, status)] * (1 + i % 3))
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    seqs = list(ClusterEvent.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 4 * 30 + 1))  # 15 calls of 1, 2, 3 events each: 30 a writer


async def _connect(query: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, f"/ws/?{query}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected
    return comm


async def _collect(comm: WebsocketCommunicator, upto: int) -> list[tuple[int, str]]:
    got: list[tuple[int, str]] = []
    while not got or got[-1][0] < upto:
        msg = await comm.receive_json_from(timeout=5)
        assert msg["type"] == "events" and msg["stream"] == "cluster", msg
        got += [(e["seq"], e["kind"]) for e in msg["events"]]
        assert all(set(e) == {"seq", "kind", "wall", "data"} for e in msg["events"])
    return got


async def _replay_then_live(setup) -> list[list[tuple[int, str]]]:
    """The (seq, kind) lists received: the replay after seq 2, then the live ones."""
    run = setup["runs"][0].pk
    g0, g1, _ = setup["gpus"]
    lease, release = sync_to_async(cluster.lease_gpus), sync_to_async(cluster.release_gpus)
    await lease(run_id=run, unit_index=0, gpus=[g0])  # seq 1
    await lease(run_id=run, unit_index=1, gpus=[g1])  # seq 2
    await release(run_id=run)  # seq 3, 4
    comm = await _connect(f"token={setup['viewer']}")
    await comm.send_json_to({"type": "subscribe", "stream": "cluster", "after": 2})
    assert await comm.receive_json_from(timeout=5) == {
        "type": "subscribed", "stream": "cluster", "after": 2}  # fmt: skip
    replayed = await _collect(comm, 4)
    await lease(run_id=run, unit_index=0, gpus=[g0, g1])  # seq 5, while subscribed
    await sync_to_async(cluster.sync_inventory)(nodes=[_rec("cc" * 28, "gpu-c")])  # seq 6
    live = await _collect(comm, 6)
    await comm.send_json_to({"type": "unsubscribe", "stream": "cluster"})
    assert await comm.receive_nothing(timeout=0.3)  # and the unsubscribe has been handled
    await release(run_id=run)  # seq 7: not sent any more
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()
    return [replayed, live]


EXPECTED = [[(3, GPU_LEASE), (4, GPU_LEASE)], [(5, GPU_LEASE), (6, NODE_STATUS)]]


@pytest.mark.asyncio
async def test_replay_then_live_woken_by_the_redis_channel_layer(setup, settings):
    settings.GYRE_EVENT_POLL_SECONDS = 60  # longer than the receive timeout: the wake-up counts
    assert await _replay_then_live(setup) == EXPECTED


@pytest.mark.asyncio
async def test_replay_then_live_by_polling_without_a_channel_layer(setup, settings):
    settings.CHANNEL_LAYERS = {}
    settings.GYRE_EVENT_POLL_SECONDS = 0.05
    assert await _replay_then_live(setup) == EXPECTED


@pytest.mark.asyncio
async def test_a_share_link_is_refused_and_run_subscriptions_still_work(setup, people):
    run = setup["runs"][0]
    _, key = await sync_to_async(teams.create_share_link)(created_by=people["owner"], run=run)
    comm = await _connect(f"share={key}")
    await comm.send_json_to({"type": "subscribe", "stream": "cluster"})
    msg = await comm.receive_json_from(timeout=5)
    assert msg["type"] == "error" and msg["stream"] == "cluster" and "share link" in msg["error"]
    await comm.send_json_to({"type": "subscribe", "stream": "gpus"})
    assert (await comm.receive_json_from(timeout=5))["type"] == "error"
    await comm.send_json_to({"type": "subscribe", "run": run.pk})  # its run: still fine
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    await comm.disconnect()
    # one signed-in socket holds a run subscription and the cluster stream side by side
    comm = await _connect(f"token={setup['outsider']}")  # not in the run's team: GPUs yes
    await sync_to_async(cluster.lease_gpus)(run_id=run.pk, unit_index=0, gpus=setup["gpus"][:1])
    await comm.send_json_to({"type": "subscribe", "stream": "cluster", "after": -1})
    assert (await comm.receive_json_from(timeout=5))["error"] == "after: a seq >= 0"
    await comm.send_json_to({"type": "subscribe", "stream": "cluster"})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    assert await _collect(comm, 1) == [(1, GPU_LEASE)]
    await comm.send_json_to({"type": "subscribe", "run": run.pk})
    assert (await comm.receive_json_from(timeout=5))["error"] == "run not found"
    await comm.disconnect()
