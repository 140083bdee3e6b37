"""The API's edge for hostile input: a bounded JSON parser (DRF's default), one refusal of
NUL in any query parameter, integer query parameters read within bounds
(``int_param``), and JSON answers for the errors Django itself raises under
``/api/`` (a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, an unknown path, a server error:
never an HTML page, never a traceback)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from gyre_core.jsonl import JsonBoundsError, find_non_finite, loads

MAX_DEPTH = 64  # a run config nests 2 deep; a fork's changes the same


class BoundedJSONParser(JSONParser):
    """JSON bodies of at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes, nested at most MAX_DEPTH,
    with finite numbers only (Postgres JSON cannot hold ``1e400``, which Python decodes as
    inf) and text only (no lone surrogate such as ``"\\ud800"``, which no UTF-8 column
    holds); every refusal is a 400 naming ``body`` or the path of the bad value."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1 if limit is not None else -1)
        if limit is not None and len(raw) > limit:
            raise ParseError({"body": f"larger than {limit} bytes"})
        try:
            data = loads(raw, max_depth=MAX_DEPTH)
        except JsonBoundsError as exc:  # a lone surrogate names its key path
            raise ParseError({exc.field or "body": exc.problem}) from None
        where = find_non_finite(data)
        if where is not None:
            raise ParseError({where: "expected a finite number (JSON like 1e400 overflows)"})
        return data


def int_param(request: Any, name: str, default: int, lo: int, hi: int) -> int:
    """Query parameter ``name`` as an integer in [lo, hi] (``default`` when absent); a
    bad one is a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: f"must be an integer, got {raw!r}"}) from None
    if not lo <= value <= hi:
        raise ValidationError({name: f"must be between {lo} and {hi}"})
    return value


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


class QueryParamsMiddleware:
    """Refuses a query parameter (name or value) holding NUL under ``/api/``, naming it:
    no lookup, filter or search can use it, and Postgres cannot even compare it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _is_api(request):
            for name, values in request.GET.lists():
                if any("\x00" in v for v in (name, *values)):
                    shown = name.replace("\x00", "\\x00")
                    return JsonResponse({shown: "must not contain a NUL character"}, status=400)
        return self.get_response(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.bad_request(request, exception)
    from django.core.exceptions import RequestDataTooBig

    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return JsonResponse({"body": f"larger than {limit} bytes"}, status=400)
    return JsonResponse({"detail": "bad request"}, status=400)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.permission_denied(request, exception)
    return JsonResponse({"detail": "permission denied"}, status=403)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    return JsonResponse({"detail": "not found"}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    if not _is_api(request):
        return defaults.server_error(request)
    return JsonResponse({"detail": "server error (logged)"}, status=500)
