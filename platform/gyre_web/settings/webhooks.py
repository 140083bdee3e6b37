"""Webhooks (gyre_web.alerts): which addresses they may reach beyond the public internet,
how many post at once in each process, and how long one attempt may take."""

from __future__ import annotations

import ipaddress

from django.core.exceptions import ImproperlyConfigured

from gyre_web.settings.env import env_float, env_list


def _nets(name: str) -> list[str]:
    nets = env_list(name, [])
    for net in nets:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {net!r} is not an address range (CIDR, e.g. 10.1.0.0/16)"
            ) from None
    return nets


# Address ranges (CIDR, comma-separated) a webhook may reach although they are not public:
# loopback, private, link-local and the like are refused unless listed here.
GYRE_WEBHOOK_ALLOW_NETS = _nets("GYRE_WEBHOOK_ALLOW_NETS")
# How many deliveries one process posts at once (off the watchdog thread).
GYRE_WEBHOOK_WORKERS = int(env_float("GYRE_WEBHOOK_WORKERS", 4.0))
if GYRE_WEBHOOK_WORKERS < 1:
    raise ImproperlyConfigured("GYRE_WEBHOOK_WORKERS must be at least 1")
# The longest one attempt may take, connecting and answering together (a slow or
# trickling target is cut off at this bound; the attempt counts as a timeout).
GYRE_WEBHOOK_TIMEOUT_SECONDS = env_float("GYRE_WEBHOOK_TIMEOUT_SECONDS", 5.0)
if GYRE_WEBHOOK_TIMEOUT_SECONDS <= 0:
    raise ImproperlyConfigured("GYRE_WEBHOOK_TIMEOUT_SECONDS must be more than 0")
