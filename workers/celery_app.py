"""The Celery app, configured from the Django settings (``CELERY_*``).

celery -A workers.celery_app worker -P solo      (embedded or service mode)
celery -A workers.celery_app beat                (the periodic reaper and inventory sync)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django
from celery import Celery

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
    # with RAY_ADDRESS set: Ray's nodes and GPUs into the inventory (a lost node shows gone)
    "sync-ray-inventory": {
        "task": "workers.tasks.sync_ray_inventory",
        "schedule": 30.0,
        "options": {"expires": 25.0},  # workers busy with runs: drop, do not pile up
    },
}
