"""Lifetimes of API tokens and share links (days; 0 = they never expire). A token or
link made without an expiry of its own expires this long after its creation; one asked
with an expiry gets it, if within this lifetime."""

from gyre_web.settings.env import env_float

GYRE_TOKEN_TTL_DAYS = env_float("GYRE_TOKEN_TTL_DAYS", 0.0)
GYRE_SHARE_TTL_DAYS = env_float("GYRE_SHARE_TTL_DAYS", 0.0)
