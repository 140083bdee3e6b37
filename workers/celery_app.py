"""The Celery app, configured from the Django settings (``CELERY_*``).

celery -A workers.celery_app worker -P solo      (embedded or service mode)
celery -A workers.celery_app beat                (the periodic reaper and inventory sync)

Every worker process also starts a watchdog thread (``workers.watchdog``): heartbeats of
the launches it executes, the reaper and the launch dispatcher, with or without beat.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django
from celery import Celery, signals

_PLATFORM = str(Path(__file__).resolve().parents[1] / "platform")
if _PLATFORM not in sys.path:
    sys.path.insert(0, _PLATFORM)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gyre_web.settings")
django.setup()

app = Celery("gyre")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["workers.tasks"]
app.conf.beat_schedule = {
    "reap-stale-runs": {"task": "workers.tasks.reap_stale_runs", "schedule": 60.0},
    "dispatch-launches": {"task": "workers.tasks.dispatch_launches", "schedule": 30.0},
    "deliver-alerts": {"task": "workers.tasks.deliver_alerts", "schedule": 15.0},
    # with RAY_ADDRESS set: Ray's nodes and GPUs into the inventory (a lost node shows gone)
    "sync-ray-inventory": {
        "task": "workers.tasks.sync_ray_inventory",
        "schedule": 30.0,
        "options": {"expires": 25.0},  # workers busy with runs: drop, do not pile up
    },
}

LAUNCH = "workers.tasks.launch_run"


@signals.worker_ready.connect
@signals.worker_process_init.connect  # a prefork pool's child runs launches: one of its own
def _start_watchdog(**kwargs: object) -> None:
    from workers.watchdog import Watchdog

    Watchdog.of_process()


@signals.worker_shutdown.connect
def _stop_watchdog(**kwargs: object) -> None:
    from workers.watchdog import Watchdog

    Watchdog.stop_process()


@signals.task_prerun.connect
def _hold_launch(task_id: str = "", task: object = None, args: object = (), **kw: object) -> None:
    """Heartbeat the run for as long as this worker process executes its launch. A launch
    run outside a worker (``apply`` in a test or a shell) starts no watchdog: its StopFlag
    writes the heartbeat, and no reaper runs in that process."""
    if getattr(task, "name", "") == LAUNCH and isinstance(args, list | tuple) and args:
        from workers.watchdog import Watchdog

        watchdog = Watchdog.running()
        if watchdog is not None:
            watchdog.hold(task_id, int(args[0]))


@signals.task_postrun.connect
def _release_launch(task_id: str = "", task: object = None, **kw: object) -> None:
    if getattr(task, "name", "") == LAUNCH:
        from workers.watchdog import Watchdog

        watchdog = Watchdog.running()
        if watchdog is not None:
            watchdog.release(task_id)
