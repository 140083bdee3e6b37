"""Serving over HTTPS, usually behind a TLS-terminating proxy (docs/platform.md, "Deploying
behind TLS"): ``GYRE_HTTPS=1`` turns on the secure defaults (HSTS, redirect to https,
secure cookies); each ``GYRE_*`` below overrides one of them. ``GYRE_TRUST_X_FORWARDED_PROTO``
is set only where a proxy in front sets ``X-Forwarded-Proto`` (and strips the client's).

A value the operator turned off explicitly (``GYRE_SSL_REDIRECT=0``: the proxy redirects)
is a decision, so ``check --deploy`` does not warn about it; one left unset is warned about.
The Content-Security-Policy is sent by ``gyre_web.csp.CspMiddleware``."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from gyre_web.settings.env import env_bool, env_float, env_list

HTTPS = env_bool("GYRE_HTTPS", False)


def _explicit_off(name: str) -> bool:
    return name in os.environ and not env_bool(name, True)


def _origins(name: str) -> list[str]:
    found = env_list(name, [])
    for origin in found:
        parts = urlsplit(origin)
        bad = parts.path not in ("", "/") or parts.query or parts.fragment or parts.username
        if parts.scheme not in ("http", "https") or not parts.hostname or bad:
            raise ImproperlyConfigured(
                f"{name}: {origin!r} is not an origin (scheme://host[:port], e.g. "
                "https://gyre.example.com)"
            )
    return [o.rstrip("/") for o in found]


SECURE_HSTS_SECONDS = int(env_float("GYRE_HSTS_SECONDS", 31_536_000 if HTTPS else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("GYRE_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
SECURE_HSTS_PRELOAD = env_bool("GYRE_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("GYRE_SSL_REDIRECT", HTTPS)
# Probes and Prometheus reach the pods over plain HTTP, inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("GYRE_SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("GYRE_CSRF_COOKIE_SECURE", HTTPS)
# Origins other than the request's own scheme://host allowed to POST with a session.
CSRF_TRUSTED_ORIGINS = _origins("GYRE_CSRF_TRUSTED_ORIGINS")
if env_bool("GYRE_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if SECURE_HSTS_PRELOAD and (SECURE_HSTS_SECONDS < 31_536_000 or not SECURE_HSTS_INCLUDE_SUBDOMAINS):
    raise ImproperlyConfigured(
        "GYRE_HSTS_PRELOAD=1 needs GYRE_HSTS_SECONDS >= 31536000 and "
        "GYRE_HSTS_INCLUDE_SUBDOMAINS=1 (the preload list refuses the domain otherwise)"
    )

GYRE_CSP_REPORT_ONLY = env_bool("GYRE_CSP_REPORT_ONLY", False)

_DECIDED = {  # variable turned off explicitly -> the deploy check it answers
    "GYRE_HSTS_SECONDS": "security.W004",
    "GYRE_SSL_REDIRECT": "security.W008",
    "GYRE_SESSION_COOKIE_SECURE": "security.W012",
    "GYRE_CSRF_COOKIE_SECURE": "security.W016",
    "GYRE_HSTS_INCLUDE_SUBDOMAINS": "security.W005",
    "GYRE_HSTS_PRELOAD": "security.W021",
}
SILENCED_SYSTEM_CHECKS = [
    check
    for name, check in _DECIDED.items()
    if (name == "GYRE_HSTS_SECONDS" and name in os.environ and SECURE_HSTS_SECONDS == 0)
    or (name != "GYRE_HSTS_SECONDS" and _explicit_off(name))
]
