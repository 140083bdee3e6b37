"""The worker's EventSink: batched inserts into the run's event log (per-run sequence
numbers), the rows derived from events (metrics, benchmark scores, rollouts, trees, role
intervals), then a channel-layer wake-up for the run's websocket group."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction
from gyre_web.cluster.services import record_role_changes
from gyre_web.runs.services import append_events, wake_run
from gyre_web.trajectories.services import record_rollout_events

from gyre_core.events import Event, RunStatus

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
PAYLOAD_EVENTS = 500  # a wake-up carries its batch up to this many events (consumers.BATCH)

# rollouts_written: the step's payload file, imported into rollouts, a tree per group of
# the step (the trees the trainer weighed) and their nodes
ROLLOUT_KINDS = frozenset(
    {"rollout_started", "rollout_progress", "rollout_finished", "rollouts_written"}
)


class DbSink:
    """Buffers events; writes a batch when it holds ``batch`` events or is ``interval``
    seconds old (so a slow run still shows up live). Call ``flush`` at the end.

    ``pace`` > 0 replays the run in time (a simulated run watched from the web): ``emit``
    holds the caller until the event's ``t`` is due at ``pace`` run-clock seconds per wall
    second, and stops holding once ``stop()`` says the run should stop."""

    def __init__(
        self,
        run_id: int,
        *,
        batch: int = 200,
        interval: float = 0.1,  # the first event of a batch waits this long at most
        pace: float = 0.0,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        self.run_id = run_id
        self.batch = batch
        self.interval = interval
        self.pace = pace
        self.stop = stop
        self.origin: float | None = None  # the wall time (monotonic) of t = 0 when pacing
        self.buffer: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        self.last_t = 0.0
        self.written = 0
        self.layer = get_channel_layer()

    def emit(self, event: Event) -> None:
        self.buffer.append(event.to_json())
        self.last_t = max(self.last_t, float(event.t))
        if len(self.buffer) >= self.batch or time.monotonic() - self.last_flush >= self.interval:
            self.flush()
        if self.pace > 0:
            self._keep_pace(float(event.t))

    def _keep_pace(self, t: float) -> None:
        now = time.monotonic()
        if self.origin is None:
            self.origin = now - t / self.pace
        due = self.origin + t / self.pace
        if due <= now:
            return
        self.flush()  # what happened so far is visible while the replay waits
        while (wait := due - time.monotonic()) > 0:
            if self.stop is not None and self.stop():
                self.pace = 0.0  # stopping: the rest goes through at full speed
                return
            time.sleep(min(wait, 0.1))  # 0.1 s: how long a stop request may wait

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.buffer:
            return
        events, self.buffer = self.buffer, []
        with transaction.atomic():
            rows = append_events(run_id=self.run_id, events=events)
            record_rollout_events(
                run_id=self.run_id, events=[e for e in events if e["kind"] in ROLLOUT_KINDS]
            )
            record_role_changes(
                run_id=self.run_id, events=[e for e in events if e["kind"] == "role_change"]
            )
            if self.layer is not None:  # wake the subscribers once the rows are visible
                message = wake_message(self.run_id, rows)
                transaction.on_commit(lambda: self._wake(message))
        self.written += len(rows)

    def _wake(self, message: dict[str, Any]) -> None:
        wake_run(run_id=self.run_id, message=message)


class JobSink:
    """What the worker hands ``run_job``: the run's DbSink, less the job's own terminal
    ``run_status``. The worker writes the run's one terminal event itself, with the final
    status (a cancelled job may end the run ``paused``) in the transaction that sets it."""

    def __init__(self, sink: DbSink, on_event: Callable[[Event], None] | None = None) -> None:
        self.sink = sink
        self.on_event = on_event  # the run's log shipper (a phase_progress makes a line)

    def emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        if not (isinstance(event, RunStatus) and event.status in TERMINAL):
            self.sink.emit(event)

    def flush(self) -> None:  # a job flushes before it checkpoints
        self.sink.flush()


def wake_message(run_id: int, rows: list[Any]) -> dict[str, Any]:
    """The wake-up for a committed batch. It carries the batch itself (as the table will
    read back: UTC ``wall``) when small enough, so each server process adds it to its run
    feed without a query; consumers check that it continues what they hold."""
    message: dict[str, Any] = {"type": "run.events", "run": run_id, "last_seq": rows[-1].seq}
    if len(rows) <= PAYLOAD_EVENTS:
        message["events"] = [
            {
                "seq": r.seq,
                "kind": r.kind,
                "t": r.t,
                "wall": _utc(r.wall).isoformat(),
                "data": r.data,
            }
            for r in rows
        ]
    return message


def _utc(wall: datetime) -> datetime:  # as the database gives it back (USE_TZ, UTC)
    return wall.astimezone(UTC) if wall.tzinfo else wall.replace(tzinfo=UTC)
