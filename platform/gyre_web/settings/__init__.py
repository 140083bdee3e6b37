"""Settings split by concern; every value comes from the environment (see each module)."""

from gyre_web.logging import LOGGING  # noqa: F401  (GYRE_LOG_FORMAT, GYRE_LOG_LEVEL)
from gyre_web.settings.agents import *  # noqa: F403
from gyre_web.settings.base import *  # noqa: F403
from gyre_web.settings.credentials import *  # noqa: F403
from gyre_web.settings.database import *  # noqa: F403
from gyre_web.settings.datasets import *  # noqa: F403
from gyre_web.settings.queue import *  # noqa: F403
from gyre_web.settings.realtime import *  # noqa: F403
from gyre_web.settings.runtime import *  # noqa: F403
from gyre_web.settings.security import *  # noqa: F403
from gyre_web.settings.tls import *  # noqa: F403
from gyre_web.settings.trust import *  # noqa: F403
from gyre_web.settings.webhooks import *  # noqa: F403
