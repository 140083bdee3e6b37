"""Channels: Redis channel layer in service mode; none in embedded mode (the websocket
consumer polls the event table, which is the source of truth in both modes)."""

from gyre_web.settings.env import env_float
from gyre_web.settings.queue import REDIS_URL

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Rides out a Redis outage: consumers keep polling the event table meanwhile.
            "BACKEND": "gyre_web.channel_layer.ResilientRedisChannelLayer",
            "CONFIG": {
                # socket_timeout None: a blocking read must not be cut off and dropped.
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                # Default capacity (100) silently drops messages under a burst of events.
                "capacity": 5000,
                "expiry": 60,
            },
        }
    }
else:
    CHANNEL_LAYERS = {}

# How often a websocket subscription re-reads the event table without a wake-up.
GYRE_EVENT_POLL_SECONDS = env_float("GYRE_EVENT_POLL_SECONDS", 0.25 if not REDIS_URL else 5.0)
# How often an open websocket re-checks its credentials and subscriptions without a
# notice (the teams services also send one on every revocation or membership change).
GYRE_WS_RECHECK_SECONDS = env_float("GYRE_WS_RECHECK_SECONDS", 5.0)
