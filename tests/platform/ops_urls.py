"""URLs for tests/platform/test_ops.py: the ops views alone, so the tests need no edit of
gyre_web/urls.py."""

from django.urls import path
from gyre_web import ops

urlpatterns = [
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
]
