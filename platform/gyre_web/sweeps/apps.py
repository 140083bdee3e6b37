from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "gyre_web.sweeps"
    label = "sweeps"
    default_auto_field = "django.db.models.BigAutoField"
