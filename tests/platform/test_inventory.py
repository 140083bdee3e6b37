"""The GPU inventory from Ray: a real two-node cluster is read by the Celery task that
beat runs with RAY_ADDRESS set (and by a run's own worker); when the worker node dies, its
Node row turns gone (never deleted, its GPUs kept) and the API says so."""

from __future__ import annotations

import pytest
import ray
from gyre_web.cluster.models import Gpu, Node
from gyre_web.cluster.services import register_gpu, sync_inventory

from gyre_core.runtime.inventory import NodeRecord
from tests.runtime.two_node import make_cluster
from workers.tasks import _sync_inventory_from_run, sync_ray_inventory


def _rec(node_id: str, name: str, alive: bool = True, gpu_units: int = 2) -> dict:
    return NodeRecord(node_id=node_id, name=name, hostname=name, address="10.0.0.1:1",
                      alive=alive, head=False, gpus=0, gpu_units=gpu_units,
                      accelerator="").to_dict()  # fmt: skip


def test_sync_writes_nodes_and_gpus_and_never_deletes(db):
    register_gpu(node_name="gpu-a", index=0, model="H100")  # registered by hand: adopted
    out = sync_inventory(nodes=[_rec("aa" * 28, "gpu-a"), _rec("bb" * 28, "gpu-b", gpu_units=1)])
    assert out == {"alive": 2, "gone": 0, "gpus": 3}
    a, b = Node.objects.get(name="gpu-a"), Node.objects.get(name="gpu-b")
    assert a.ray_node_id == "aa" * 28 and a.alive and a.last_seen_at is not None
    assert [g.index for g in a.gpus.order_by("index")] == [0, 1] and b.gpus.count() == 1
    seen = b.last_seen_at
    # b dead in Ray (it reports no resources then); a no longer reported at all
    out = sync_inventory(nodes=[_rec("bb" * 28, "gpu-b", alive=False, gpu_units=0)])
    assert out == {"alive": 0, "gone": 2, "gpus": 0}
    a.refresh_from_db()
    b.refresh_from_db()
    assert not a.alive and not b.alive and b.last_seen_at == seen
    assert Gpu.objects.count() == 3  # their GPUs stay, for the history of leases
    # a node that died before it was ever seen makes no row
    sync_inventory(nodes=[_rec("cc" * 28, "gpu-c", alive=False, gpu_units=0)])
    assert not Node.objects.filter(name="gpu-c").exists()
    # back: alive again
    sync_inventory(nodes=[_rec("bb" * 28, "gpu-b")])
    b.refresh_from_db()
    assert b.alive and b.last_seen_at > seen


def test_the_task_is_a_no_op_without_ray_address(db, settings):
    settings.RAY_ADDRESS = ""
    assert sync_ray_inventory() == {}
    assert not Node.objects.exists()


@pytest.mark.slow
def test_a_killed_ray_node_shows_gone(db, settings, people, client_for):
    if ray.is_initialized():
        ray.shutdown()
    cluster = make_cluster()
    try:
        nodes = cluster.start()
        settings.RAY_ADDRESS = cluster.address
        _sync_inventory_from_run()  # not connected to Ray (no run here): does nothing
        assert not Node.objects.exists()
        ray.init(address=cluster.address)  # what a run's driver is: the run's own sync
        _sync_inventory_from_run()
        ray.shutdown()
        assert Node.objects.filter(alive=True).count() == 2
        assert sync_ray_inventory() == {"alive": 2, "gone": 0, "gpus": 4}  # beat's task
        (worker,) = [n for n in nodes if not n.head]
        (head,) = [n for n in nodes if n.head]
        assert Node.objects.get(ray_node_id=worker.node_id).gpus.count() == 2
        api = client_for(people["viewer"])
        rows = api.get("/api/gpus/").json()["results"]
        assert len(rows) == 4 and all(r["node_alive"] for r in rows)

        cluster.kill_worker()
        cluster.wait_dead(worker.node_id)
        assert sync_ray_inventory() == {"alive": 1, "gone": 1, "gpus": 2}
        gone = Node.objects.get(ray_node_id=worker.node_id)
        assert not gone.alive and gone.gpus.count() == 2  # kept, shown gone
        assert Node.objects.get(ray_node_id=head.node_id).alive
        rows = api.get("/api/gpus/").json()["results"]
        assert {(r["node_name"], r["node_alive"]) for r in rows} == {
            (head.name, True),
            (worker.name, False),
        }
        assert sum(not r["node_alive"] for r in rows) == 2
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
