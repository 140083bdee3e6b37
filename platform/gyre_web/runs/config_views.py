"""The run-config schema and presets for the launch form, straight from gyre_core."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypedDict

import yaml
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_core.config import config_schema, default_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


class _ConfigFieldBase(TypedDict):
    type: Literal["bool", "int", "float", "str"]
    default: Any
    help: str


class ConfigField(_ConfigFieldBase, total=False):
    """One field of ``config_schema()``; choices and bounds only where the field has them."""

    choices: list[str]
    min: float
    max: float
    above: float


class PresetsSerializer(serializers.Serializer):
    default = serializers.DictField(help_text="the default run config")
    presets = serializers.DictField(child=serializers.DictField(), help_text="config by name")


@extend_schema(responses=dict[str, ConfigField])
@api_view(["GET"])
def schema(request: Request) -> Response:
    """Every config field by dotted path: type, default, help, choices, bounds."""
    return Response(config_schema())


@extend_schema(responses=PresetsSerializer)
@api_view(["GET"])
def presets(request: Request) -> Response:
    """The demo configs of ``configs/`` by name, and the default config."""
    found = {
        p.stem: yaml.safe_load(p.read_text(encoding="utf-8"))
        for p in sorted(CONFIGS.glob("*.yaml"))
    }
    return Response({"default": default_config().to_dict(), "presets": found})
