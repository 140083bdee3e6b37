"""Celery app and tasks that turn a Run row into a running gyre_core runtime."""
