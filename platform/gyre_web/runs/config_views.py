"""The run-config schema and presets for the launch form, straight from gyre_core."""

from __future__ import annotations

from pathlib import Path

import yaml
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from gyre_core.config import config_schema, default_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@extend_schema(responses={200: dict})
@api_view(["GET"])
def schema(request: Request) -> Response:
    """Every config field by dotted path: type, default, help, choices, bounds."""
    return Response(config_schema())


@extend_schema(responses={200: dict})
@api_view(["GET"])
def presets(request: Request) -> Response:
    """The demo configs of ``configs/`` by name, and the default config."""
    found = {
        p.stem: yaml.safe_load(p.read_text(encoding="utf-8"))
        for p in sorted(CONFIGS.glob("*.yaml"))
    }
    return Response({"default": default_config().to_dict(), "presets": found})
