from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "gyre_web.sweeps"
    label = "sweeps"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gyre_web.runs import hooks
        from gyre_web.sweeps.services import run_left_active

        hooks.on_run_left_active(run_left_active)  # its sweep's next run takes the slot
