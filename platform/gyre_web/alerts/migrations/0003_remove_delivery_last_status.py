"""The exact HTTP status is no longer kept (0002 turned it into a class)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("alerts", "0002_delivery_last_result")]

    operations = [migrations.RemoveField(model_name="delivery", name="last_status")]
