"""The delivery log keeps a status class or a failure reason class, not the target's
answer: last_status (the exact HTTP status) becomes last_result, and earlier error texts
(which could name what answered at an address) become a generic reason."""

from django.db import migrations, models


def to_classes(apps, schema_editor):
    Delivery = apps.get_model("alerts", "Delivery")
    for d in Delivery.objects.exclude(last_status=None, last_error="").iterator():
        if d.last_status is not None:
            d.last_result, d.last_error = f"{d.last_status // 100}xx", ""
        else:
            d.last_result, d.last_error = "failed", "connection error"
        d.save(update_fields=["last_result", "last_error"])


class Migration(migrations.Migration):
    dependencies = [("alerts", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="delivery",
            name="last_result",
            field=models.CharField(blank=True, max_length=8),
        ),
        migrations.RunPython(to_classes, migrations.RunPython.noop),
    ]
