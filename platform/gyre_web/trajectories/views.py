"""Rollouts and trajectory trees of the runs a user (or share link) can see; tree nodes
by parent (lazy loading), search within a tree, the path to a node and a node's tokens."""

from __future__ import annotations

import re

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_web.access import IdCursorPagination, share_link_of
from gyre_web.runs.selectors import runs_visible
from gyre_web.trajectories import node_tokens, selectors
from gyre_web.trajectories.models import Rollout, Tree, TreeNode

_NODE_ID = re.compile(r"[0-9]{1,18}")


class RolloutSerializer(serializers.ModelSerializer):
    class Meta:
        model = Rollout
        fields = [
            "id",
            "run",
            "rollout_id",
            "step",
            "task_id",
            "group_id",
            "status",
            "progress",
            "reward",
            "turns",
            "tokens",
            "version_min",
            "version_max",
            "t_started",
            "t_finished",
        ]


class TreeSerializer(serializers.ModelSerializer):
    dedup_ratio = serializers.FloatField(read_only=True)

    class Meta:
        model = Tree
        fields = [
            "id",
            "run",
            "group_id",
            "step",
            "rollouts",
            "nodes",
            "depth",
            "tokens_unique",
            "tokens_per_call",
            "dedup_ratio",
            "branch_counts",
        ]


class TreeNodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = TreeNode
        fields = [
            "id",
            "parent",
            "kind",
            "depth",
            "path_key",
            "token_start",
            "token_end",
            "trainable",
            "preview",
            "advantage",
            "leaves",
            "taken",
        ]


class NodeTokensSerializer(serializers.Serializer):
    """One node's tokens as parallel lists (``pieces`` is null without a tokenizer; the
    per-token ``logprobs``, ``versions``, ``advantages`` and ``scales`` are null where not
    generated; a token's loss counts its advantage times its scale, ``train.average``)."""

    node = serializers.IntegerField()
    token_start = serializers.IntegerField()
    token_end = serializers.IntegerField()
    advantage = serializers.FloatField(allow_null=True)
    payload = serializers.BooleanField(help_text="false: no readable payload file holds it")
    decoded = serializers.BooleanField(help_text="true: the run's tokenizer gave the text")
    truncated = serializers.BooleanField()
    text = serializers.CharField(allow_null=True)
    ids = serializers.ListField(child=serializers.IntegerField())
    pieces = serializers.ListField(child=serializers.CharField(), allow_null=True)
    generated = serializers.ListField(child=serializers.BooleanField())
    logprobs = serializers.ListField(child=serializers.FloatField(allow_null=True))
    versions = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    advantages = serializers.ListField(child=serializers.FloatField(allow_null=True))
    scales = serializers.ListField(child=serializers.FloatField(allow_null=True))


class NodePagination(IdCursorPagination):
    ordering = "path_key"  # unique within a tree; depth-first order


class RolloutViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RolloutSerializer
    filterset_fields = ["run", "step", "status", "group_id", "task_id"]
    share_link_readable = True

    def get_queryset(self) -> QuerySet[Rollout]:
        runs = runs_visible(self.request.user, share_link_of(self.request))
        return Rollout.objects.filter(run__in=runs)


class TreeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = TreeSerializer
    filterset_fields = ["run", "group_id", "step"]
    share_link_readable = True

    def get_queryset(self) -> QuerySet[Tree]:
        runs = runs_visible(self.request.user, share_link_of(self.request))
        return Tree.objects.filter(run__in=runs)

    @extend_schema(
        responses=TreeNodeSerializer(many=True),
        filters=False,
        parameters=[OpenApiParameter("parent", int, description="a node id (default: roots)")],
    )
    @action(
        detail=True,
        methods=["get"],
        serializer_class=TreeNodeSerializer,
        pagination_class=NodePagination,
    )
    def nodes(self, request: Request, pk: str | None = None) -> Response:
        """Children of ``?parent=ID`` (the roots without it), in depth-first order."""
        tree = self.get_object()
        raw = request.query_params.get("parent")
        if raw is not None and not _NODE_ID.fullmatch(raw):  # "²".isdigit() is True
            raise ValidationError({"parent": "a node id (digits 0-9)"})
        rows = selectors.children(tree_id=tree.pk, parent_id=int(raw) if raw else None)
        page = self.paginate_queryset(rows)
        data = TreeNodeSerializer(page, many=True).data
        return self.get_paginated_response(data)

    @extend_schema(
        responses=TreeNodeSerializer(many=True),
        filters=False,
        parameters=[OpenApiParameter("q", str, required=True, description="the text to find")],
    )
    @action(
        detail=True, methods=["get"], serializer_class=TreeNodeSerializer, pagination_class=None
    )
    def search(self, request: Request, pk: str | None = None) -> Response:
        tree = self.get_object()
        text = request.query_params.get("q", "").strip()
        if not text:
            raise ValidationError({"q": "give the text to search for"})
        rows = selectors.search_nodes(tree_id=tree.pk, text=text)
        return Response(TreeNodeSerializer(rows, many=True).data)

    @extend_schema(responses=TreeNodeSerializer(many=True), filters=False)
    @action(
        detail=True,
        methods=["get"],
        url_path=r"path/(?P<node_id>\d+)",
        serializer_class=TreeNodeSerializer,
        pagination_class=None,
    )
    def path(self, request: Request, pk: str | None = None, node_id: str = "") -> Response:
        tree = self.get_object()
        node = get_object_or_404(TreeNode, tree=tree, pk=int(node_id))
        return Response(TreeNodeSerializer(selectors.path_to(node=node), many=True).data)

    @action(
        detail=True,
        methods=["get"],
        url_path=r"nodes/(?P<node_id>\d+)/tokens",
        serializer_class=NodeTokensSerializer,
        pagination_class=None,
    )
    def node_tokens(self, request: Request, pk: str | None = None, node_id: str = "") -> Response:
        """One node's tokens from the tree's payload file: ids, text, and per token whether
        it was generated, its log-probability, policy version and advantage."""
        tree = self.get_object()
        node = get_object_or_404(TreeNode, tree=tree, pk=int(node_id))
        return Response(node_tokens.read_node_tokens(tree=tree, node=node))
