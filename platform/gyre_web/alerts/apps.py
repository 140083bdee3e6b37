from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "gyre_web.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"
