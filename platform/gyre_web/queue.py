"""The platform's queue client: Celery tasks sent BY NAME (dispatch only; the platform
imports no worker code). Its own ``Celery`` app, configured from the Django settings
(``CELERY_*``, the same the workers read), is made on first use; it registers no tasks
and does not become Celery's current app."""

from __future__ import annotations

from functools import cache
from typing import Any

from celery import Celery

# A send while the broker is down fails after about a second, not kombu's default retries.
SEND_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}


@cache
def client() -> Celery:
    app = Celery("gyre-web", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    return app


def send_task(
    name: str, *, args: list[Any], task_id: str, kwargs: dict[str, Any] | None = None
) -> None:
    """Send task ``name``; a broker error raises after about a second."""
    client().send_task(name, args=args, kwargs=kwargs, task_id=task_id, retry_policy=SEND_RETRY)
