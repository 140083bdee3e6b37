"""Dataset uploads (POST /api/datasets/): the largest file a team may upload. Lines are
bounded by GYRE_IMPORT_MAX_LINE_BYTES, as trajectory imports are."""

from gyre_web.settings.env import env_float

GYRE_DATASET_MAX_BYTES = int(env_float("GYRE_DATASET_MAX_BYTES", 1024 * 2**20))
