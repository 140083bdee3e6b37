"""Fill the metric rollups of the points stored before rollups existed."""

from django.db import migrations


def backfill(apps, schema_editor):
    from gyre_web.runs.rollups import rebuild

    rebuild(apps.get_model("runs", "MetricPoint"), apps.get_model("runs", "MetricRollup"))


def clear(apps, schema_editor):
    apps.get_model("runs", "MetricRollup").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_metric_rollup")]

    operations = [migrations.RunPython(backfill, clear)]
