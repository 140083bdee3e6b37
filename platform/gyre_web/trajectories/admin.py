from django.contrib import admin

from gyre_web.trajectories.models import Rollout, Tree, TreeNode


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ("run", "rollout_id", "step", "status", "progress", "reward", "tokens")
    list_filter = ("status",)
    raw_id_fields = ("run",)


@admin.register(Tree)
class TreeAdmin(admin.ModelAdmin):
    list_display = ("run", "group_id", "rollouts", "nodes", "depth", "tokens_unique")
    raw_id_fields = ("run",)


@admin.register(TreeNode)
class TreeNodeAdmin(admin.ModelAdmin):
    list_display = ("tree", "path_key", "kind", "depth", "trainable", "leaves")
    raw_id_fields = ("tree", "parent")
