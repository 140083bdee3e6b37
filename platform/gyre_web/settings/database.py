"""DATABASE_URL (postgres://..., psycopg 3) or, when absent, a SQLite file in the data dir."""

from gyre_web.settings.env import data_dir, env_str, parse_database_url

_url = env_str("DATABASE_URL")
if _url:
    DATABASES = {"default": parse_database_url(_url)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": data_dir() / "gyre.sqlite3",
            # The worker and the web process share the file: wait for a lock, don't fail.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    }
