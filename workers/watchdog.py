"""The watchdog thread every worker process starts: it writes the heartbeat of the launches
this process executes (every GYRE_HEARTBEAT_SECONDS, whatever the run itself is doing) and
runs the reaper, the launch dispatcher and the sweeps' catch-up (every GYRE_REAPER_SECONDS).
Webhook deliveries run on a thread of their own (:class:`Deliverer`, a bounded pool of
posts), which each tick wakes: a slow or hostile webhook never holds a heartbeat, the
reaper or the dispatcher.

A solo worker busy with a run takes no periodic task from beat, and ``make demo`` runs no
beat at all; a thread of the worker's own does not wait for either. Any number of
watchdogs (and beat's ``reap_stale_runs``) may run at once: the reaper and the dispatcher
lock the rows they take with skip_locked."""

from __future__ import annotations

import logging
import os
import threading
import time

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)


class Deliverer:
    """Posts the due webhook deliveries (``deliver_due``) whenever woken, or every
    ``every`` seconds, until ``stopping`` is set."""

    def __init__(self, every: float, stopping: threading.Event) -> None:
        self.every = every
        self.stopping = stopping
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gyre-webhooks", daemon=True)
        self.thread.start()

    def kick(self) -> None:
        self.wake.set()

    def _run(self) -> None:
        from gyre_web.alerts.services import deliver_due

        while not self.stopping.is_set():
            self.wake.wait(self.every)
            self.wake.clear()
            if self.stopping.is_set():
                break
            try:
                deliver_due()
            except Exception as err:  # the database may be restarting: try again
                log.warning("webhook deliveries failed: %s", type(err).__name__)
            finally:
                connection.close()


class Watchdog:
    _instance: Watchdog | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.held: dict[str, int] = {}  # launch task id -> run id, executing in this process
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.deliverer = Deliverer(float(settings.GYRE_REAPER_SECONDS), self.stopping)
        self.thread = threading.Thread(target=self._run, name="gyre-watchdog", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.deliverer.kick()
        self.thread.join(timeout=10)
        self.deliverer.thread.join(timeout=10)

    @classmethod
    def of_process(cls) -> Watchdog:
        """This process's watchdog, started on first use (and again after a fork)."""
        with cls._guard:
            w = cls._instance
            if w is None or w.pid != os.getpid() or not w.thread.is_alive():
                w = cls._instance = cls()
            return w

    @classmethod
    def running(cls) -> Watchdog | None:
        """This process's watchdog if its worker started one, else None."""
        w = cls._instance
        alive = w is not None and w.pid == os.getpid() and w.thread.is_alive()
        return w if alive else None

    @classmethod
    def stop_process(cls) -> None:
        w = cls._instance
        if w is not None and w.pid == os.getpid():
            w.stop()

    def hold(self, task_id: str, run_id: int) -> None:
        with self.lock:
            self.held[task_id] = run_id

    def release(self, task_id: str) -> None:
        with self.lock:
            self.held.pop(task_id, None)

    def _run(self) -> None:
        from gyre_web.runs import services
        from gyre_web.sweeps.services import advance_due

        beat = float(settings.GYRE_HEARTBEAT_SECONDS)
        every = float(settings.GYRE_REAPER_SECONDS)
        last_reap = float("-inf")  # reap at once: a worker starting after a crash finds it
        while not self.stopping.is_set():
            try:
                with self.lock:
                    held = list(self.held.items())
                for task_id, run_id in held:
                    services.heartbeat_launch(run_id=run_id, task_id=task_id)
                if time.monotonic() - last_reap >= every:
                    last_reap = time.monotonic()
                    services.reap_stale_runs()
                    services.dispatch_launches()
                    advance_due()
                    self.deliverer.kick()  # posts on its own thread: never waited for
            except Exception as err:  # the database may be restarting: try again next tick
                log.warning("watchdog tick failed: %s: %s", type(err).__name__, err)
            finally:
                connection.close()  # this thread's own; a new one next tick
            self.stopping.wait(min(beat, every))
