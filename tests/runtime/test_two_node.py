"""Scale-out on a real two-node Ray cluster: a run whose units span a head and a worker
node goes on when the worker node is killed mid-run. The lost units leave the pool, the
call in flight on one of them moves to a surviving engine, no agent session restarts, and
Ray's inventory reports the node dead."""

from __future__ import annotations

import threading
import time

import pytest
import ray

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from tests.runtime.two_node import TwoNodes, make_cluster

pytestmark = pytest.mark.slow

CONFIG = {
    "steps": 2,
    "cluster": {"units": 4, "object_store_mb": 100},
    # colocate: every unit serves rollouts first, so both worker-node units take calls
    "scheduler": {"policy": "colocate", "drain_deadline_s": 0.0},
    "rollout": {
        "tasks_per_step": 1,
        "group_size": 4,  # 4 sessions over 4 engines: the worker node's engines get calls
        "benchmark_tasks": 1,
        "max_turns": 3,
        "max_new_tokens": 32,  # calls long enough to be caught in flight
    },
}


@pytest.fixture
def cluster():
    if ray.is_initialized():  # another module's local cluster: this test joins its own
        ray.shutdown()
    nodes = make_cluster()
    try:
        nodes.start()
        yield nodes
    finally:
        if ray.is_initialized():
            ray.shutdown()
        nodes.stop()


@pytest.fixture
def model_dir(tmp_path_factory):
    from gyre_core.runtime.session import make_model_dir

    return make_model_dir(RunConfig.from_dict(CONFIG), tmp_path_factory.mktemp("m"))


class NodeKiller:
    """The run's event sink, and a thread that kills the worker node at the first moment
    one of its units has a call in flight (asked of the unit's engine itself)."""

    def __init__(self, nodes: TwoNodes, worker_id: str) -> None:
        self.nodes, self.worker_id = nodes, worker_id
        self.sink = ListSink()
        self.on_worker: dict[int, str] = {}  # unit -> actor name, for units on the worker
        self.killed_at: float | None = None
        self.running_seen = 0
        self.idle_at: dict[int, float] = {}  # unit -> when its move to idle arrived
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def emit(self, e) -> None:
        self.sink.emit(e)
        if e.kind == "role_change" and e.node == self.worker_id:
            self.on_worker.setdefault(e.unit, "")
            if e.to_role == "idle":
                self.idle_at[e.unit] = time.monotonic()
        if e.kind == "rollout_started" and not self.thread.is_alive() and not self.done.is_set():
            self.thread.start()

    def _watch(self) -> None:
        try:
            actors = {}
            while self.killed_at is None and not self.done.is_set():
                for unit in self.on_worker:
                    if unit not in actors:
                        (name,) = [a for a in ray.util.list_named_actors()
                                   if a.endswith(f"-unit-{unit}")]  # fmt: skip
                        actors[unit] = ray.get_actor(name)
                for actor in actors.values():
                    load = ray.get(actor.load.remote(), timeout=5)
                    if load.running > 0:
                        self.nodes.kill_worker()
                        self.killed_at = time.monotonic()
                        self.running_seen = load.running
                        return
                time.sleep(0.005)
        finally:
            self.done.set()


def test_a_run_survives_losing_the_worker_node(cluster, model_dir, tmp_path):
    before = {n.node_id: n for n in cluster._wait(lambda ns: True, 5, "inventory")}
    assert sum(n.alive for n in before.values()) == 2
    assert all(n.gpu_units == 2 for n in before.values())
    (worker_id,) = [i for i, n in before.items() if not n.head]
    cfg = RunConfig.from_dict({**CONFIG, "model": {"checkpoint": str(model_dir)},
                               "cluster": {**CONFIG["cluster"], "ray_address": cluster.address}})  # fmt: skip
    killer = NodeKiller(cluster, worker_id)
    t0 = time.monotonic()
    out = run_job(cfg, sink=killer, workdir=tmp_path)
    wall = time.monotonic() - t0
    killer.done.set()
    events = killer.sink.events

    # the units spanned both nodes, and the worker node died while a call ran on it
    placed = {e.unit: e.node for e in events if e.kind == "role_change"}
    assert set(placed.values()) == set(before), placed
    lost = {u for u, node in placed.items() if node == worker_id}
    assert len(lost) == 2, "2 gpu_unit per node: two units on each"
    assert killer.killed_at is not None and killer.running_seen >= 1, "killed with a call in flight"

    # the run went on to the end on the head's units
    assert out["status"] == "succeeded" and out["steps"] == 2, out
    assert [e.step for e in events if e.kind == "step_finished"] == [1, 2]
    last_role = {}
    for e in events:
        if e.kind == "role_change":
            last_role[e.unit] = e.to_role
    assert all(last_role[u] == "idle" for u in lost), last_role  # the lost units left the pool
    gone_at = {e.unit: e.t for e in events if e.kind == "role_change" and e.to_role == "idle"}
    assert set(gone_at) == lost  # and only they did
    # the call in flight on the dead node moved to a surviving engine, keeping its session
    moved = [e for e in events if e.kind == "call_migrated" and e.from_unit in lost]
    assert moved and all(e.to_unit not in lost for e in moved)
    assert out["calls_migrated"] >= 1 and out["sessions_restarted"] == 0
    started = {e.rollout_id for e in events if e.kind == "rollout_started"}
    finished = {e.rollout_id for e in events if e.kind == "rollout_finished"}
    assert started == finished and len(finished) == 8  # every session ran to its end
    trained = [e for e in events if e.kind == "step_finished"]
    assert all(e.metrics.get("dp_width", 0) >= 1 for e in trained)

    # Ray's inventory: the worker node is dead, the head alive with its gpu_units
    after = {n.node_id: n for n in cluster.wait_dead(worker_id)}
    assert not after[worker_id].alive and after[worker_id].gpu_units == 0
    (head_id,) = [i for i in before if i != worker_id]
    assert after[head_id].alive and after[head_id].gpu_units == 2
    left = {u: round(t - killer.killed_at, 2) for u, t in killer.idle_at.items()}
    print(f"two-node run: {wall:.1f}s, calls_migrated={out['calls_migrated']}, lost units "
          f"{sorted(lost)} left the pool after {left} s")  # fmt: skip
