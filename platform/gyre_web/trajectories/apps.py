from django.apps import AppConfig


class TrajectoriesConfig(AppConfig):
    name = "gyre_web.trajectories"
    label = "trajectories"
    default_auto_field = "django.db.models.BigAutoField"
