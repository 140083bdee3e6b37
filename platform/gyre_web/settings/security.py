"""Secret key, debug and hosts. Without GYRE_SECRET_KEY a key is generated once and kept
in the data dir (embedded mode); in service mode (DATABASE_URL set) it is required."""

from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key

from gyre_web.settings.env import data_dir, env_bool, env_float, env_list, env_str


def _secret_key() -> str:
    key = env_str("GYRE_SECRET_KEY")
    if key:
        if len(key) < 32:
            raise ImproperlyConfigured("GYRE_SECRET_KEY must be at least 32 characters")
        return key
    if env_str("DATABASE_URL"):
        raise ImproperlyConfigured("GYRE_SECRET_KEY is required when DATABASE_URL is set")
    path = data_dir() / "secret_key"
    if not path.exists():
        path.write_text(get_random_secret_key())
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("GYRE_DEBUG", False)
ALLOWED_HOSTS = env_list("GYRE_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

# Failed sign-ins (gyre_web.teams.lockout): this many for one username (per client address:
# the second; 0 turns a limit off) within the window lock it for the lock period.
GYRE_LOGIN_MAX_FAILURES = int(env_float("GYRE_LOGIN_MAX_FAILURES", 5))
GYRE_LOGIN_MAX_FAILURES_PER_IP = int(env_float("GYRE_LOGIN_MAX_FAILURES_PER_IP", 50))
GYRE_LOGIN_WINDOW_SECONDS = env_float("GYRE_LOGIN_WINDOW_SECONDS", 900.0)
GYRE_LOGIN_LOCK_SECONDS = env_float("GYRE_LOGIN_LOCK_SECONDS", 900.0)
AUTHENTICATION_BACKENDS = [
    "gyre_web.teams.lockout.LockoutBackend",  # first: refuses while locked
    "django.contrib.auth.backends.ModelBackend",
]
