"""Where runs execute: the Ray cluster (RAY_ADDRESS) and the runs' working directories."""

from gyre_web.settings.env import data_dir, env_bool, env_float, env_str

RAY_ADDRESS = env_str("RAY_ADDRESS")
GYRE_DATA_DIR = data_dir()
GYRE_RUNS_DIR = GYRE_DATA_DIR / "runs"
# Every worker process writes the heartbeat of the runs it executes this often (a thread
# of its own, so a long step or a model load never looks like a dead worker).
GYRE_HEARTBEAT_SECONDS = env_float("GYRE_HEARTBEAT_SECONDS", 5.0)
# An active run whose heartbeat is older than this lost its worker: the reaper resumes it
# from its checkpoint (or fails it), and a cancel ends it at once.
GYRE_HEARTBEAT_TIMEOUT_SECONDS = env_float("GYRE_HEARTBEAT_TIMEOUT_SECONDS", 60.0)
# How often each worker's watchdog thread runs the reaper and the launch dispatcher.
GYRE_REAPER_SECONDS = env_float("GYRE_REAPER_SECONDS", 15.0)
# The reaper resumes one run at most this many times; then it fails it.
GYRE_REAPER_MAX_RESUMES = int(env_float("GYRE_REAPER_MAX_RESUMES", 3))
# A launch message that could not be sent is retried this long after the last attempt.
GYRE_OUTBOX_RETRY_SECONDS = env_float("GYRE_OUTBOX_RETRY_SECONDS", 5.0)
# A sent launch whose run is still queued this long after is sent again (the broker may
# have lost it); the run's claim makes a message that arrives twice launch it once.
GYRE_LAUNCH_RESEND_SECONDS = env_float("GYRE_LAUNCH_RESEND_SECONDS", 900.0)
# Hard time limit of one launch_run task.
GYRE_RUN_TIME_LIMIT_SECONDS = env_float("GYRE_RUN_TIME_LIMIT_SECONDS", 7 * 24 * 3600.0)
# A redelivered launch takes a run over only when its worker has been quiet this long.
GYRE_TAKEOVER_SECONDS = env_float("GYRE_TAKEOVER_SECONDS", 30.0)
# Trajectory imports (POST /api/runs/{id}/import/): the largest file, and its longest line.
GYRE_IMPORT_MAX_BYTES = int(env_float("GYRE_IMPORT_MAX_BYTES", 1024 * 2**20))
GYRE_IMPORT_MAX_LINE_BYTES = int(env_float("GYRE_IMPORT_MAX_LINE_BYTES", 8 * 2**20))
# Runs may name an external agent (rollout.agent, rollout.agent_command): code the workers
# import or run. Off unless the operator allows it; a run naming one is refused by field.
GYRE_EXTERNAL_AGENTS = env_bool("GYRE_EXTERNAL_AGENTS", False)
# A run's stored log lines (GET /api/runs/{id}/logs/): at most this many a run; the
# line past it says the limit was reached and later lines are dropped.
GYRE_RUN_LOG_MAX_LINES = int(env_float("GYRE_RUN_LOG_MAX_LINES", 50000))
