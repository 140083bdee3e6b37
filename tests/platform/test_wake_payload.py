"""Wake-ups that carry their batch: the payload equals what the event table reads back, a
run feed takes it without a query (and ignores a batch that would leave a gap), and the
wake-ups leave the sink from their own thread, in order."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from gyre_web.realtime import consumers
from gyre_web.runs import services
from gyre_web.runs.models import RunEvent
from gyre_web.teams import services as teams

from gyre_core.events import RolloutProgress
from tests.platform.test_run_feed import _collect, _subscribe
from workers.sink import DbSink, wake_message

pytestmark = pytest.mark.django_db(transaction=True)


def _emit(run_id: int, count: int, batch: int) -> None:
    sink = DbSink(run_id, batch=batch, interval=3600)
    for i in range(count):
        sink.emit(RolloutProgress(t=i * 0.5, rollout_id=f"r{i % 3}", turns=i, tokens=10 * i,
                                  progress=i / count))  # fmt: skip
    sink.flush()


def test_payload_equals_what_the_table_reads_back(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="payload")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    rows = services.append_events(
        run_id=run.pk,
        events=[
            {"kind": "run_status", "t": 0.0, "wall": "2026-01-02T03:04:05.123456+02:00",
             "data": {"status": "running", "step": 0, "message": "ñ"}},
            {"kind": "rollout_progress", "t": 1.5, "data": {"rollout_id": "r", "turns": 2}},
        ],
    )  # fmt: skip
    stored = [e.as_message() for e in RunEvent.objects.filter(run=run).order_by("seq")]
    message = wake_message(run.pk, rows)
    assert message["events"] == stored and message["last_seq"] == 2
    assert stored[0]["wall"] == "2026-01-02T01:04:05.123456+00:00"


def test_feed_keeps_only_a_contiguous_batch():
    feed = consumers.RunFeed(-1)
    ev = [{"seq": s} for s in range(1, 8)]
    feed.offer(ev[2:4])  # 3, 4: starts the cache
    feed.offer(ev[5:7])  # 6, 7: would leave a gap after 4
    feed.offer(ev[1:3])  # 2, 3: already behind the top
    assert [e["seq"] for e in feed.cache] == [3, 4]
    feed.offer(ev[4:6])  # 5, 6
    assert [e["seq"] for e in feed.cache] == [3, 4, 5, 6]


@pytest.mark.asyncio
async def test_subscribers_get_batches_from_the_wake_up_without_a_table_read(
    people, sim_config, monkeypatch
):
    reads: list[tuple[int, int]] = []
    real = consumers._events

    async def counted(run_id: int, after: int):
        reads.append((run_id, after))
        return await real(run_id, after)

    monkeypatch.setattr(consumers, "_events", counted)
    exp = await sync_to_async(services.create_experiment)(team=people["team"], name="wake")
    run = await sync_to_async(services.create_run)(experiment=exp, config=sim_config, launch=False)
    _, key = await sync_to_async(teams.create_api_token)(user=people["member"], name="w")
    comms = [await _subscribe(key, run.pk, 0) for _ in range(3)]
    await sync_to_async(_emit)(run.pk, 60, 7)  # 9 batches, each carried by its wake-up
    for comm in comms:
        assert await _collect(comm, 60) == list(range(1, 61))
        await comm.disconnect()
    # Only each subscription's first look at the table (cursor 0); every batch after that
    # came from the wake-ups.
    assert reads == [(run.pk, 0)] * len(reads) and len(reads) <= 3
