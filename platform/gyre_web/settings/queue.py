"""Celery: Redis as the broker when REDIS_URL is set, else kombu's filesystem transport
(a broker that needs no server) under the data dir."""

from gyre_web.settings.env import check_redis_url, data_dir, env_float, env_str

REDIS_URL = check_redis_url(env_str("REDIS_URL")) if env_str("REDIS_URL") else ""

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    # An unacknowledged launch (its worker died) is redelivered after this many seconds.
    _visibility = env_float("GYRE_BROKER_VISIBILITY_TIMEOUT", 3600.0)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": _visibility,
        # Sweep for abandoned messages every few seconds (kombu's default: ~100 s).
        "unacked_restore_interval": int(max(1, min(10, _visibility // 3))),
        "unacked_restore_throttle": 1,
    }
else:
    _queue = data_dir() / "queue"
    for _sub in ("in", "processed", "control"):
        (_queue / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue / "in"),
        "data_folder_out": str(_queue / "in"),
        "processed_folder": str(_queue / "processed"),
        "store_processed": False,
        # kombu's broadcast/pidbox exchanges; its default is ./control in the cwd.
        "control_folder": str(_queue / "control"),
    }

CELERY_TASK_ACKS_LATE = True  # a worker lost mid-run -> the task is redelivered
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# Keep the worker's real stdout/stderr: Ray (started by real runs) needs their file numbers.
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # workers log through settings.LOGGING
