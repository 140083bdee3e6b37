"""What a config that arrives through the platform may name (``gyre_web.runs.config_policy``):
the operator's plugin allow-list, the folders a run may read and write, and the MLflow
server of the workers. ``RAY_ADDRESS`` (settings.runtime) is the Ray cluster's."""

from __future__ import annotations

import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from gyre_web.settings.env import REPO, data_dir, env_list, env_str

__all__ = [
    "GYRE_CACHE_ROOTS",
    "GYRE_DATA_ROOTS",
    "GYRE_MLFLOW_TRACKING_URI",
    "GYRE_PLUGINS",
]
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _plugins(name: str, found: list[str]) -> tuple[str, ...]:
    for item in found:
        if not _IMPORT_PATH.match(item):
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not an import path 'package.module:name'"
            )
    return tuple(found)


def _roots(raw: list[str], default: list[Path]) -> tuple[Path, ...]:
    """Folders, comma-separated: absolute, or relative to the repository; resolved now."""
    if not raw:
        return tuple(p.resolve() for p in default)
    return tuple((REPO / Path(item).expanduser()).resolve() for item in raw)


# Code a web config may name (rollout.env, rollout.reward_fn, rollout.agent): these
# 'package.module:name' paths, besides the `gyre.plugins` entry points of installed packages.
GYRE_PLUGINS = _plugins("GYRE_PLUGINS", env_list("GYRE_PLUGINS", []))
# Files a web config may name by path (model.checkpoint, rollout.tasks, warm_start.weights,
# warm_start.data, train.offpolicy_data): only under these folders (default: the shipped configs/).
GYRE_DATA_ROOTS = _roots(env_list("GYRE_DATA_ROOTS", []), [REPO / "configs"])
# Folders a web config's warm_start.cache may name (it is written): default the data
# folder's cache/ and the repository's .data/cache/ (the shipped learn-*.yaml configs' one).
GYRE_CACHE_ROOTS = _roots(
    env_list("GYRE_CACHE_ROOTS", []), [data_dir() / "cache", REPO / ".data" / "cache"]
)
# The MLflow server the workers log to when a run sets tracking.mlflow ('' = a SQLite store
# in each run's folder); a web config may leave tracking.mlflow_tracking_uri empty or name this.
GYRE_MLFLOW_TRACKING_URI = env_str("GYRE_MLFLOW_TRACKING_URI")
