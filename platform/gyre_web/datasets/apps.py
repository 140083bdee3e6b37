from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "gyre_web.datasets"
    label = "datasets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gyre_web.datasets import services  # noqa: F401  (connects the file cleanup)
