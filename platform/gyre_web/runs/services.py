"""The runs app's write surface, re-exported from the modules that hold each concern (the
workers may import an app's ``services``, ``selectors`` and ``models`` only, and many
callers use this module):

- ``experiments``: experiments and runs created (config validated), forked;
- ``launch``: the launch outbox and its dispatcher;
- ``lifecycle``: the status machine (``transition`` and the ``hooks`` for a run's end),
  stop, resume, and the worker's lease: claim, heartbeats, the reaper;
- ``eventlog``: events appended, metric points and rollups, wake-ups;
- ``logs`` and ``exports``: the run log and checkpoint exports.
"""

from __future__ import annotations

from gyre_web.runs.config_policy import ConfigInvalid
from gyre_web.runs.eventlog import (
    append_events,
    emit_status,
    rebuild_metric_rollups,
    record_metric_points,
    wake_run,
    wake_subscribers,
)
from gyre_web.runs.experiments import (
    create_experiment,
    create_run,
    deep_merge,
    fork_run,
    runnable_config,
    validate_config,
)
from gyre_web.runs.exports import claim_export, finish_export
from gyre_web.runs.launch import dispatch_launches, queue_launch, send_launch
from gyre_web.runs.lifecycle import (
    WORKING,
    IllegalTransition,
    can_resume,
    claim_launch,
    heartbeat,
    heartbeat_launch,
    reap_stale_runs,
    request_stop,
    resume_run,
    transition,
)
from gyre_web.runs.logs import append_log_lines, level_name
from gyre_web.runs.paths import run_dir

__all__ = [
    "WORKING",
    "ConfigInvalid",
    "IllegalTransition",
    "append_events",
    "append_log_lines",
    "can_resume",
    "claim_export",
    "claim_launch",
    "create_experiment",
    "create_run",
    "deep_merge",
    "dispatch_launches",
    "emit_status",
    "finish_export",
    "fork_run",
    "heartbeat",
    "heartbeat_launch",
    "level_name",
    "queue_launch",
    "reap_stale_runs",
    "rebuild_metric_rollups",
    "record_metric_points",
    "request_stop",
    "resume_run",
    "run_dir",
    "runnable_config",
    "send_launch",
    "transition",
    "validate_config",
    "wake_run",
    "wake_subscribers",
]
