from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "gyre_web.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gyre_web.alerts.services import queue_for
        from gyre_web.runs import hooks

        hooks.on_run_ended(queue_for)  # a run never ends without its alerts queued
