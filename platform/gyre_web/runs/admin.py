from django.contrib import admin

from gyre_web.runs.models import BenchmarkScore, Experiment, MetricPoint, Run, RunEvent


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "visibility", "created_at")
    list_filter = ("visibility", "team")
    search_fields = ("name",)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "experiment", "policy", "backend", "status", "step")
    list_filter = ("status", "backend", "policy")
    raw_id_fields = ("parent",)


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "name", "step", "value")
    raw_id_fields = ("run",)


@admin.register(BenchmarkScore)
class BenchmarkScoreAdmin(admin.ModelAdmin):
    list_display = ("run", "suite", "step", "score", "tasks")
    raw_id_fields = ("run",)


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ("run", "seq", "kind", "t", "wall")
    list_filter = ("kind",)
    raw_id_fields = ("run",)
