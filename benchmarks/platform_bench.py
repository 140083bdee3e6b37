"""Platform benchmarks against real Postgres and Redis. Prints measured figures (nothing is
asserted):

1. API latency p50/p95 (Django's test client, token auth, the full DRF stack) for the runs
   list, a run's detail, a run's metrics downsampled to 1k points out of the points stored
   across a few runs (and several runs compared), and the children of nodes of one large
   trajectory tree. The rows are written with ``bulk_create`` through the models.
2. Event ingest rate through the worker's ``DbSink`` (batched inserts into the event log
   plus the rollout rows the events imply).
3. Websocket latency p50/p95 from an event's creation (its ``wall`` timestamp, taken just
   before ``DbSink.emit``) to its receipt by each of N websocket clients subscribed to the
   run through a real daphne server, the Redis channel layer waking the consumers. The
   clients run in a child process (plain asyncio, RFC 6455 frames), the emitter here.

Everything happens in a throwaway database (``test_<name>``) that the script creates with
Django's ``setup_databases`` and drops at the end, and a Redis database of its own.

    .venv/bin/python benchmarks/platform_bench.py          # modest sizes (a few minutes)
    .venv/bin/python benchmarks/platform_bench.py --full   # the issue's sizes: 1M metric
        # points, a 100k-node tree, 50 clients on a run emitting 500 events/s
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIM_CONFIG: dict[str, Any] = {
    "backend": "sim",
    "steps": 2,
    "scheduler": {"policy": "elastic"},
    "sim": {"workload": "uniform", "rollouts": 32, "gpus": 16, "rollouts_per_step": 8},
}


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 50) * 1000:7.1f} ms   p95 {pct(values, 95) * 1000:7.1f} ms"


# --- the websocket clients (child process; no Django) --------------------------------------


class Ws:
    """A minimal asyncio websocket client: text frames out (masked), frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, host: str, port: int, path: str) -> Ws:
        reader, writer = await asyncio.open_connection(host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nOrigin: http://{host}:{port}\r\n\r\n"
            ).encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"handshake refused: {head[:80]!r}")
        return cls(reader, writer)

    async def send_json(self, obj: Any) -> None:
        payload = json.dumps(obj).encode()
        assert len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(struct.pack("!BB", 0x81, 0x80 | len(payload)) + mask + masked)
        await self.writer.drain()

    async def recv_json(self) -> Any:
        while True:
            b0, b1 = await self.reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
            payload = await self.reader.readexactly(n)
            if b0 & 0x0F == 0x8:
                raise ConnectionError("server closed the websocket")
            if b0 & 0x0F == 0x1:
                return json.loads(payload)


def _wall_seconds(wall: str) -> float:
    return datetime.fromisoformat(wall).timestamp()


async def _client(host: str, port: int, key: str, run: int, last: int, ready: Any) -> Any:
    ws = await Ws.connect(host, port, f"/ws/?token={key}")
    await ws.send_json({"type": "subscribe", "run": run, "after": 0})
    msg = await ws.recv_json()
    if msg.get("type") != "subscribed":
        raise RuntimeError(f"subscribe failed: {msg}")
    ready()
    latencies: list[float] = []
    seqs: list[int] = []
    while not seqs or seqs[-1] < last:
        msg = await ws.recv_json()
        now = time.time()
        if msg.get("type") != "events":
            continue
        for e in msg["events"]:
            seqs.append(e["seq"])
            latencies.append(now - _wall_seconds(e["wall"]))
    ws.writer.close()
    contiguous = seqs == list(range(1, last + 1))
    return latencies, contiguous


async def _clients_main(host: str, port: int, key: str, run: int, n: int, last: int) -> None:
    connected = 0

    def ready() -> None:
        nonlocal connected
        connected += 1
        if connected == n:
            print("ready", flush=True)

    tasks = [_client(host, port, key, run, last, ready) for _ in range(n)]
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
    every = [x for lat, _ in results for x in lat]
    per_client_p95 = [pct(lat, 95) for lat, _ in results]
    out = {
        "p50": pct(every, 50),
        "p95": pct(every, 95),
        "p99": pct(every, 99),
        "max": max(every),
        "worst_client_p95": max(per_client_p95),
        "received": len(every),
        "all_contiguous": all(ok for _, ok in results),
        "cpu_s": time.process_time(),
    }
    print(json.dumps(out), flush=True)


# --- Django side ------------------------------------------------------------------------


def setup_django(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["REDIS_URL"] = args.redis_url
    os.environ.setdefault("GYRE_SECRET_KEY", "bench-secret-key-" + "x" * 40)
    os.environ["GYRE_DB_CONN_MAX_AGE"] = "60"
    os.environ["DJANGO_SETTINGS_MODULE"] = "gyre_web.settings"
    import django

    django.setup()


def fill(args: argparse.Namespace) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from gyre_web.runs import services
    from gyre_web.runs.models import MetricPoint, Run
    from gyre_web.teams import services as teams
    from gyre_web.trajectories.services import create_tree

    user = get_user_model().objects.create_user("bench")
    team = teams.create_team(name="Bench", owner=user)
    _, key = teams.create_api_token(user=user, name="bench")
    exp = services.create_experiment(team=team, name="bench")
    first = services.create_run(experiment=exp, config=SIM_CONFIG, launch=False, name="r0")
    fields = {f: getattr(first, f) for f in ("config", "policy", "backend", "seed", "steps")}
    Run.objects.bulk_create(
        [Run(experiment=exp, name=f"r{i}", **fields) for i in range(1, args.runs)],
        batch_size=1000,
    )
    metric_runs = list(Run.objects.filter(experiment=exp).order_by("id")[: args.metric_runs])
    if "api" in args.skip:  # the rest only serves the API figures
        return {"key": key, "run": first.pk, "experiment": exp}
    names = ["loss", "reward"]
    per_series = args.metric_points // (len(metric_runs) * len(names))
    t0 = time.perf_counter()
    rng = random.Random(0)
    batch: list[MetricPoint] = []
    for run in metric_runs:
        for name in names:
            for step in range(per_series):
                batch.append(MetricPoint(run=run, name=name, step=step, value=rng.random()))
                if len(batch) == 10_000:
                    MetricPoint.objects.bulk_create(batch)
                    batch = []
    MetricPoint.objects.bulk_create(batch)
    stored = MetricPoint.objects.count()
    print(f"filled {stored:,} metric points in {time.perf_counter() - t0:.1f} s "
          f"({len(metric_runs)} runs x {len(names)} names x {per_series:,} steps)")  # fmt: skip
    t0 = time.perf_counter()  # bulk_create goes around the services: build the rollups
    rows = services.rebuild_metric_rollups(run_ids=[r.pk for r in metric_runs])
    print(f"built {rows:,} metric rollup rows in {time.perf_counter() - t0:.1f} s")

    # A tree with every internal node holding ``branching`` children, breadth-first.
    b = args.tree_branching
    nodes = [
        {"id": i, "parent": (i - 1) // b if i else None, "token_start": i * 10,
         "token_end": i * 10 + 10, "trainable": 10, "preview": f"node {i}", "leaves": 1}
        for i in range(args.tree_nodes)
    ]  # fmt: skip
    t0 = time.perf_counter()
    tree = create_tree(run_id=first.pk, group_id="bench", nodes=nodes)
    print(f"filled a {args.tree_nodes:,}-node tree (branching {b}, depth {tree.depth}) "
          f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    return {
        "key": key,
        "run": first.pk,
        "runs": [r.pk for r in metric_runs],
        "tree": tree.pk,
        "user": user,
        "experiment": exp,
    }


def bench_api(args: argparse.Namespace, data: dict[str, Any]) -> None:
    from django.db import connection
    from gyre_web.trajectories.models import TreeNode
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {data['key']}")
    connection.ensure_connection()
    internal = list(
        TreeNode.objects.filter(tree_id=data["tree"], leaves=1)
        .exclude(children=None)
        .values_list("pk", flat=True)
        .order_by("?")[:200]
    )
    run, runs, tree = data["run"], ",".join(map(str, data["runs"])), data["tree"]
    cases: list[tuple[str, Any]] = [
        ("runs list (50 per page)", lambda: "/api/runs/"),
        ("run detail", lambda: f"/api/runs/{run}/"),
        ("metrics, 1 run, 1k points", lambda: f"/api/runs/{run}/metrics/?names=loss&points=1000"),
        (
            f"metrics, {len(data['runs'])} runs x 2 names, 1k points",
            lambda: f"/api/runs/metrics/?runs={runs}&points=1000",
        ),
        ("tree children (roots)", lambda: f"/api/trees/{tree}/nodes/"),
        ("tree children (random node)",
         lambda: f"/api/trees/{tree}/nodes/?parent={random.choice(internal)}"),
    ]  # fmt: skip
    print(f"\nAPI latency, {args.requests} requests each after 5 warm-up "
          f"(Django test client, token auth):")  # fmt: skip
    for label, url in cases:
        for _ in range(5):
            assert client.get(url()).status_code == 200
        times = []
        size = 0
        for _ in range(args.requests):
            u = url()
            t0 = time.perf_counter()
            resp = client.get(u)
            times.append(time.perf_counter() - t0)
            assert resp.status_code == 200, (u, resp.status_code)
            size = len(resp.content)
        points = ""
        if "metrics" in label:
            body = resp.json()
            points = f"  ({sum(len(s['points']) for s in body['series'])} points back)"
        print(f"  {label:38s} {ms(times)}   {size / 1024:6.1f} KiB{points}")


def _emit_events(
    run_id: int, count: int, rate: float, committed: list[float] | None = None, **sink_kw: Any
) -> float:
    """Emit ``count`` rollout_progress events through a DbSink, at ``rate`` per second
    (0: as fast as possible); returns the seconds it took, final flush included. With
    ``committed``, appends each event's seconds from creation to its batch's commit."""
    from gyre_core.events import RolloutProgress
    from workers.sink import DbSink

    class TimedSink(DbSink):
        def emit(self, event: Any) -> None:
            pending.append(time.time())
            super().emit(event)

        def flush(self) -> None:
            created = pending[:]
            pending.clear()
            super().flush()
            if committed is not None:
                now = time.time()
                committed.extend(now - c for c in created)

    pending: list[float] = []
    sink = TimedSink(run_id, **sink_kw)
    t0 = time.perf_counter()
    for i in range(count):
        if rate:
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        sink.emit(
            RolloutProgress(t=i / max(rate, 1.0), rollout_id=f"r{i % 100}", turns=i // 100,
                            tokens=i, progress=min(1.0, i / count))
        )  # fmt: skip
    sink.flush()
    return time.perf_counter() - t0


def bench_ingest(args: argparse.Namespace, data: dict[str, Any]) -> None:
    from gyre_web.runs import services

    run = services.create_run(experiment=data["experiment"], config=SIM_CONFIG, launch=False)
    n = args.ingest_events
    took = _emit_events(run.pk, n, 0.0)
    print(f"\nEvent ingest through DbSink (batch 200): {n:,} events in {took:.2f} s = "
          f"{n / took:,.0f} events/s (no subscribers)")  # fmt: skip


def _start_daphne(args: argparse.Namespace, db_name: str) -> tuple[subprocess.Popen, int]:
    from django.db import connection

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db_name}",
        PYTHONPATH=os.pathsep.join([str(ROOT / "platform"), str(ROOT)]),
    )
    profile = ["-m", "cProfile", "-o", args.profile_daphne] if args.profile_daphne else []
    proc = subprocess.Popen(
        [sys.executable, *profile, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "gyre_web.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port
        except OSError:
            if proc.poll() is not None:
                died = proc.stderr.read().decode() if proc.stderr else "daphne died"
                raise RuntimeError(died) from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("daphne did not start")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_ws(args: argparse.Namespace, data: dict[str, Any], db_name: str) -> None:
    from gyre_web.runs import services

    count = int(args.ws_rate * args.ws_seconds)
    daphne, port = _start_daphne(args, db_name)
    try:
        print(f"\nWebsocket latency, event created -> received, {args.ws_clients} clients on "
              f"one run emitting {args.ws_rate:g} events/s for {args.ws_seconds:g} s "
              f"(daphne, Redis channel layer):")  # fmt: skip
        for interval in args.sink_intervals:
            run = services.create_run(
                experiment=data["experiment"], config=SIM_CONFIG, launch=False
            )
            child = subprocess.Popen(
                [sys.executable, __file__, "--_clients", "127.0.0.1", str(port), data["key"],
                 str(run.pk), str(args.ws_clients), str(count)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"clients failed to subscribe: {line!r}")
            committed: list[float] = []
            cpu0, daphne0 = time.process_time(), _cpu_seconds(daphne.pid)
            took = _emit_events(run.pk, count, args.ws_rate, committed, interval=interval)
            out, _ = child.communicate(timeout=600)
            res = json.loads(out.strip().splitlines()[-1])
            print(f"  DbSink interval {interval * 1000:4.0f} ms: created -> committed "
                  f"{ms(committed)}   (load average {os.getloadavg()[0]:.1f}; CPU seconds: "
                  f"emitter {time.process_time() - cpu0:.1f}, daphne "
                  f"{_cpu_seconds(daphne.pid) - daphne0:.1f}, clients {res['cpu_s']:.1f})")  # fmt: skip
            print(f"  DbSink interval {interval * 1000:4.0f} ms: p50 {res['p50'] * 1000:6.1f} ms"
                  f"   p95 {res['p95'] * 1000:6.1f} ms   p99 {res['p99'] * 1000:6.1f} ms"
                  f"   max {res['max'] * 1000:6.1f} ms   worst client p95 "
                  f"{res['worst_client_p95'] * 1000:6.1f} ms   "
                  f"({res['received']:,} deliveries, achieved {count / took:,.0f} events/s, "
                  f"all in order: {res['all_contiguous']})")  # fmt: skip
    finally:
        daphne.terminate()
        try:
            daphne.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daphne.kill()
            daphne.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_clients":
        host, port, key, run, n, last = sys.argv[2:8]
        asyncio.run(_clients_main(host, int(port), key, int(run), int(n), int(last)))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--full", action="store_true", help="the issue's sizes")
    p.add_argument(
        "--database-url",
        default="postgres://postgres@127.0.0.1:5432/gyre_bench",
        help="the script works in test_<name>, created and dropped here",
    )
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    p.add_argument("--runs", type=int, default=500, help="runs in the experiment")
    p.add_argument("--metric-runs", type=int, default=4, help="runs holding metric points")
    p.add_argument("--metric-points", type=int, default=200_000, help="in all (--full: 1M)")
    p.add_argument("--tree-nodes", type=int, default=20_000, help="(--full: 100k)")
    p.add_argument("--tree-branching", type=int, default=10)
    p.add_argument("--requests", type=int, default=100, help="per endpoint")
    p.add_argument("--ingest-events", type=int, default=10_000)
    p.add_argument("--ws-clients", type=int, default=20, help="(--full: 50)")
    p.add_argument("--ws-rate", type=float, default=200, help="events/s (--full: 500)")
    p.add_argument("--ws-seconds", type=float, default=5, help="(--full: 10)")
    p.add_argument(
        "--sink-intervals",
        type=float,
        nargs="+",
        default=[0.1, 0.2],
        help="DbSink flush intervals to try, seconds (the worker uses 0.1)",
    )
    p.add_argument("--skip", nargs="*", default=[], choices=["api", "ingest", "ws"])  # fmt: skip
    p.add_argument("--profile-daphne", metavar="FILE", help="run daphne under cProfile")
    args = p.parse_args()
    if args.full:
        args.metric_points, args.tree_nodes = 1_000_000, 100_000
        args.ws_clients, args.ws_rate, args.ws_seconds = 50, 500.0, 10.0
    setup_django(args)
    import redis
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    redis.Redis.from_url(args.redis_url).flushdb()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    old = setup_databases(verbosity=0, interactive=False)
    db_name = connection.settings_dict["NAME"]
    try:
        print(f"throwaway database: {db_name}")
        data = fill(args)
        if "api" not in args.skip:
            bench_api(args, data)
        if "ingest" not in args.skip:
            bench_ingest(args, data)
        if "ws" not in args.skip:
            bench_ws(args, data, db_name)
    finally:
        connection.close()
        teardown_databases(old, verbosity=0)
        redis.Redis.from_url(args.redis_url).flushdb()
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
