"""Structured logs: one JSON object a line on stderr, for log shippers (Loki, Fluent Bit,
CloudWatch), or plain text for a terminal.

``LOGGING`` is a ``dictConfig`` the settings import. ``GYRE_LOG_FORMAT`` (``json`` or
``text``, default ``json``) picks the formatter and ``GYRE_LOG_LEVEL`` (default ``INFO``)
the root level. Fields of a JSON line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, ``process``, ``exc`` when an exception is attached, and every ``extra=``
the caller passed (``log.info("launched", extra={"run_id": 7})`` -> ``"run_id": 7``).
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
    | {"message", "asctime", "taskName"}
)
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("json", "text")


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON; values JSON cannot hold are written as repr."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=repr, ensure_ascii=False)


def _choice(name: str, default: str, allowed: tuple[str, ...], upper: bool) -> str:
    raw = os.environ.get(name, "").strip() or default
    value = raw.upper() if upper else raw.lower()
    if value not in allowed:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return value


def build_logging(fmt: str | None = None, level: str | None = None) -> dict[str, Any]:
    """The ``LOGGING`` dict; arguments override ``GYRE_LOG_FORMAT`` / ``GYRE_LOG_LEVEL``."""
    fmt = fmt or _choice("GYRE_LOG_FORMAT", "json", FORMATS, upper=False)
    level = level or _choice("GYRE_LOG_LEVEL", "INFO", LEVELS, upper=True)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": JsonFormatter},
            "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": fmt},
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Django re-raises what it logs here as 500s; one line each is enough.
            "django": {"level": level, "propagate": True},
            # Every query at DEBUG would drown the rest.
            "django.db.backends": {"level": "INFO" if level == "DEBUG" else level},
            # Embedded mode's filesystem broker has no host, and kombu warns so at every
            # connection: nothing an operator can act on. With Redis, its warnings stay.
            **({} if os.environ.get("REDIS_URL") else {"kombu.connection": {"level": "ERROR"}}),
        },
    }


LOGGING = build_logging()
