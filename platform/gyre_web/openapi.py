"""The OpenAPI schema's error answers, documented once for every operation.

``ApiAutoSchema`` (the project's ``DEFAULT_SCHEMA_CLASS``) adds to each operation the error
statuses it can answer, each with the JSON ``Error`` body, from what the view declares:

- 400 when the operation reads a request body or query parameters (a field error, a
  malformed body); 413 and 415 when it reads a request body (over the size limits; a
  content type it does not parse);
- 401 and 403 unless the view lets anyone in (no credentials; a share link or a role that
  may not do this);
- 404 when the path names an object (not yours, or none), or the list is paginated (an
  unknown ``cursor``);
- 429 when the view has throttles.

An operation that answers more (a 409 on a forbidden state change, a 404 for an unknown run
in a query) declares it in ``extend_schema(responses=...)`` with ``ERROR``; the codes an operation
declares itself are kept as they are.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers
from rest_framework.permissions import AllowAny

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        'An error, as Django REST framework writes it: `{"detail": "..."}` for an error of '
        "the whole request (credentials, permission, not found, conflict, throttled), or "
        '`{"field": ["message", ...]}` (or `{"field": "message"}`) naming each field or query '
        "parameter that was refused (an object of the same shape for a nested field, such as "
        "`config`; `non_field_errors` for the whole body)."
    ),
    "properties": {"detail": {"type": "string"}},
    "additionalProperties": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}},
            {"type": "object"},
        ]
    },
}


class ErrorSerializer(serializers.Serializer):
    """Documentation only: the body of every error answer (``ERROR_SCHEMA``)."""


class ErrorSchema(OpenApiSerializerExtension):  # type: ignore[misc]
    target_class = ErrorSerializer

    def get_name(self, auto_schema: Any, direction: str) -> str:
        return "Error"

    def map_serializer(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        return ERROR_SCHEMA


ERROR = ErrorSerializer

_REASONS = {
    "400": "The request was refused: the body names each refused field.",
    "401": "No credentials, or unknown, revoked or expired ones.",
    "403": "Signed in, but this caller (a share link, or this role) may not do this.",
    "404": "No such object among those this caller can see.",
    "413": "The request body is over the size limit.",
    "415": "The request body's content type is not one this operation reads.",
    "429": "Too many requests; retry later.",
}


class ApiAutoSchema(AutoSchema):  # type: ignore[misc]
    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        ref = self.resolve_serializer(ErrorSerializer(), "response").ref
        responses = operation["responses"]
        for code in self._error_codes(operation):
            if code not in responses:
                content = {"application/json": {"schema": ref}}
                responses[code] = {"content": content, "description": _REASONS[code]}
        for code, response in responses.items():
            if code in _REASONS and not response.get("description"):
                response["description"] = _REASONS[code]
        return operation

    def _error_codes(self, operation: dict[str, Any]) -> list[str]:
        params = operation.get("parameters", [])
        has_body = "requestBody" in operation
        codes = []
        if has_body or any(p["in"] == "query" for p in params):
            codes.append("400")
        if not all(isinstance(p, AllowAny) for p in self.view.get_permissions()):
            codes += ["401", "403"]
        if any(p["in"] == "path" for p in params) or any(p["name"] == "cursor" for p in params):
            codes.append("404")
        if has_body:
            codes += ["413", "415"]
        if self.view.get_throttles():
            codes.append("429")
        return codes
