from django.contrib import admin

from gyre_web.cluster.models import Gpu, GpuLease, Node, RoleInterval, Unit


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "address", "alive", "last_seen_at")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("node", "index", "model", "memory_mb")


@admin.register(Unit)
class UnitAdmin(admin.ModelAdmin):
    list_display = ("run", "index")
    raw_id_fields = ("run",)


@admin.register(GpuLease)
class GpuLeaseAdmin(admin.ModelAdmin):
    list_display = ("gpu", "unit", "run", "acquired_at", "released_at")
    raw_id_fields = ("run", "unit")


@admin.register(RoleInterval)
class RoleIntervalAdmin(admin.ModelAdmin):
    list_display = ("run", "unit", "role", "start", "end")
    raw_id_fields = ("run", "unit")
