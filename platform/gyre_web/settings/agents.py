"""How the workers run an external agent's command (``rollout.agent_command``).

``gyre_core.rollout.agent_sandbox`` reads the same two variables where the command starts;
here they are checked when a web or worker process starts, so that a bad value fails fast
and the platform never runs agents unconfined:

* ``GYRE_AGENT_SANDBOX``: ``bwrap`` (the default, and the only value the platform takes;
  ``none`` is for ``gyre run`` on a user's own machine);
* ``GYRE_AGENT_ENV``: comma-separated names of the worker's variables passed on to agents.
"""

from __future__ import annotations

import re

from django.core.exceptions import ImproperlyConfigured

from gyre_web.settings.env import env_list, env_str

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def agent_sandbox() -> str:
    value = env_str("GYRE_AGENT_SANDBOX").lower() or "bwrap"
    if value == "none":
        raise ImproperlyConfigured(
            "GYRE_AGENT_SANDBOX='none' is refused on the platform: agent commands of its runs "
            "always run under bubblewrap (unset it, or set it to bwrap)"
        )
    if value != "bwrap":
        raise ImproperlyConfigured(f"GYRE_AGENT_SANDBOX={value!r} is not one of: bwrap")
    return value


def agent_env() -> list[str]:
    names = env_list("GYRE_AGENT_ENV", [])
    bad = [n for n in names if not _NAME.fullmatch(n)]
    if bad:
        raise ImproperlyConfigured(f"GYRE_AGENT_ENV: not a variable name: {', '.join(bad)}")
    return names


GYRE_AGENT_SANDBOX = agent_sandbox()
GYRE_AGENT_ENV = agent_env()
