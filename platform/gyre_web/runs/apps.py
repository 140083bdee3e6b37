from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "gyre_web.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"
