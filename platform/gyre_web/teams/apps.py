from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "gyre_web.teams"
    label = "teams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gyre_web.teams import lockout, schema  # noqa: F401  (auth schemes, sign-in signals)
