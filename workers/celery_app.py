"""The Celery app, configured from the Django settings (``CELERY_*``).

celery -A workers.celery_app worker -P solo      (embedded or service mode)
celery -A workers.celery_app beat                (the periodic reaper)
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
}
