"""Rollouts, trajectory trees and tree nodes. Token payloads live in files (``payload_path``),
never one row per token; a node keeps only its token span and a short text preview."""

from __future__ import annotations

from django.db import models


class Rollout(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="rollouts")
    rollout_id = models.CharField(max_length=100)
    step = models.IntegerField(default=0)
    task_id = models.CharField(max_length=200, blank=True)
    group_id = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=20, default="running")
    progress = models.FloatField(default=0.0)
    reward = models.FloatField(null=True, blank=True)
    turns = models.IntegerField(default=0)
    tokens = models.IntegerField(default=0)
    version_min = models.IntegerField(null=True, blank=True)
    version_max = models.IntegerField(null=True, blank=True)
    t_started = models.FloatField(null=True, blank=True)  # seconds on the run's clock
    t_finished = models.FloatField(null=True, blank=True)
    payload_path = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "rollout_id"], name="one_rollout_per_id")
        ]
        indexes = [models.Index(fields=["run", "step"], name="rollout_by_step")]


class Tree(models.Model):
    """One group's rollouts as one training step trained them: the trainer weighs each
    step's batch on its own, so a group whose rollouts span two steps has a tree per step
    part, each with the advantages that step used. ``step`` 0: an upload, weighed whole."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="trees")
    group_id = models.CharField(max_length=100)
    step = models.IntegerField(
        default=0, help_text="the training step whose batch held these rollouts; 0: an upload"
    )
    rollouts = models.IntegerField(default=0)
    nodes = models.IntegerField(default=0)
    depth = models.IntegerField(default=0)
    tokens_unique = models.IntegerField(default=0)
    tokens_per_call = models.IntegerField(default=0)  # what per-call storage would hold
    branch_counts = models.JSONField(default=dict, blank=True)
    payload_path = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "group_id", "step"], name="one_tree_per_group_step"
            )
        ]

    @property
    def dedup_ratio(self) -> float:
        return self.tokens_per_call / self.tokens_unique if self.tokens_unique else 1.0


class TreeNode(models.Model):
    tree = models.ForeignKey(Tree, on_delete=models.CASCADE, related_name="tree_nodes")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    kind = models.CharField(max_length=20, default="continue")  # continue, compaction, ...
    depth = models.IntegerField(default=0)
    # Fixed-width base-36 child ordinals, concatenated (services.path_key): sorting by it
    # walks the tree depth-first; a node's subtree is the keys that start with its key.
    path_key = models.CharField(max_length=2400)
    token_start = models.IntegerField(default=0)
    token_end = models.IntegerField(default=0)
    trainable = models.IntegerField(default=0)
    preview = models.CharField(max_length=300, blank=True)
    advantage = models.FloatField(null=True, blank=True)
    leaves = models.IntegerField(default=0)
    taken = models.IntegerField(
        null=True,
        blank=True,
        help_text="generated tokens the step trained (train.max_paths); null: every one",
    )

    class Meta:
        indexes = [
            models.Index(fields=["tree", "parent", "path_key"], name="node_children"),
            models.Index(fields=["tree", "path_key"], name="node_by_path"),
        ]
