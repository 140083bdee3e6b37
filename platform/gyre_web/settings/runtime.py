"""Where runs execute: the Ray cluster (RAY_ADDRESS) and the runs' working directories."""

from gyre_web.settings.env import data_dir, env_float, env_str

RAY_ADDRESS = env_str("RAY_ADDRESS")
GYRE_DATA_DIR = data_dir()
GYRE_RUNS_DIR = GYRE_DATA_DIR / "runs"
# A running run whose worker has not written a heartbeat for this long is marked failed.
GYRE_HEARTBEAT_TIMEOUT_SECONDS = env_float("GYRE_HEARTBEAT_TIMEOUT_SECONDS", 300.0)
# Hard time limit of one launch_run task.
GYRE_RUN_TIME_LIMIT_SECONDS = env_float("GYRE_RUN_TIME_LIMIT_SECONDS", 7 * 24 * 3600.0)
# A redelivered launch takes a run over only when its worker has been quiet this long.
GYRE_TAKEOVER_SECONDS = env_float("GYRE_TAKEOVER_SECONDS", 30.0)
# Trajectory imports (POST /api/runs/{id}/import/): the largest file, and its longest line.
GYRE_IMPORT_MAX_BYTES = int(env_float("GYRE_IMPORT_MAX_BYTES", 1024 * 2**20))
GYRE_IMPORT_MAX_LINE_BYTES = int(env_float("GYRE_IMPORT_MAX_LINE_BYTES", 8 * 2**20))
