"""Celery tasks. They take ids, are idempotent (a redelivered launch resumes the same run
from its checkpoint), have time limits, and retry on transient database errors."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from celery.exceptions import Reject
from django.conf import settings
from django.db import OperationalError, transaction
from gyre_web.cluster.services import close_role_intervals, foreign_launch, release_gpus
from gyre_web.runs import services
from gyre_web.runs.models import Run, Status

from gyre_core.events import RunStatus
from workers.celery_app import app
from workers.logship import LogShipper
from workers.sink import DbSink, JobSink

log = logging.getLogger(__name__)
INVENTORY_EVERY_S = 30.0  # how often a run on a shared Ray cluster refreshes the inventory
FOREIGN_REQUEUE_S = 1.0  # a pause before another deployment's launch goes back to the queue


class StopFlag:
    """``should_stop`` for run_job: reads the run's stop request at most every ``every``
    seconds (cheap enough to call per event) and writes the heartbeat while at it."""

    def __init__(self, run_id: int, every: float = 0.25) -> None:
        self.run_id = run_id
        self.every = every
        self.checked = 0.0
        self.mode = ""
        self.synced = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self.mode and now - self.checked >= self.every:
            self.checked = now
            self.mode = (
                Run.objects.filter(pk=self.run_id).values_list("stop_requested", flat=True).first()
                or ""
            )
            services.heartbeat(run_id=self.run_id)
            if now - self.synced >= INVENTORY_EVERY_S:
                self.synced = now
                _sync_inventory_from_run()
        return bool(self.mode)


def _status_event(sink: DbSink, status: str, step: int, message: str = "") -> None:
    sink.emit(RunStatus(t=sink.last_t, status=status, step=step, message=message))
    sink.flush()


@app.task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
    time_limit=int(settings.GYRE_RUN_TIME_LIMIT_SECONDS),
    soft_time_limit=int(settings.GYRE_RUN_TIME_LIMIT_SECONDS) - 60,
)
def launch_run(self: Any, run_id: int, deployment: str = "") -> str:
    """queued -> starting -> running -> succeeded | failed | cancelled | paused.
    Another deployment's launch (one broker shared by two) goes back to the queue for its
    owner's workers, never acknowledged as done here (``cluster.deployments``)."""
    foreign = foreign_launch(run_id=run_id, sender=deployment)
    if foreign:
        time.sleep(FOREIGN_REQUEUE_S)  # no hot loop while only this worker takes messages
        raise Reject(foreign, requeue=bool(deployment))  # keyless, run unknown: dropped
    claimed = services.claim_launch(run_id=run_id, task_id=self.request.id or "")
    if claimed is None:
        return "skipped"
    shipper = LogShipper(run_id).start()  # the run's log lines, until it ends
    try:
        return _launch(self, run_id, *claimed, shipper)
    finally:
        shipper.close()


def _launch(task: Any, run_id: int, run: Run, resume: bool, shipper: LogShipper) -> str:
    from gyre_core.config import ConfigError
    from gyre_core.runtime import error_line, run_job

    workdir = Path(settings.GYRE_RUNS_DIR) / str(run_id)
    workdir.mkdir(parents=True, exist_ok=True)
    continuing = resume  # a resume request or a takeover, with or without a checkpoint
    resume = resume and any(workdir.iterdir())
    stop = StopFlag(run_id)
    sink = DbSink(run_id, stop=stop)
    try:
        # The stored config decided again under this worker's own settings (its agents
        # flag, plugin allow-list, roots and addresses): what it refuses never starts.
        # -> the config as it runs: names resolved to paths, the operator's addresses.
        cfg = services.runnable_config(run)
    except services.ConfigInvalid as err:
        message = f"refused by this worker's settings: {err}"
        _finish(run_id, sink, shipper, Status.FAILED, message, error=message)
        return Status.FAILED
    except ConfigError as err:  # the stored config is not a config (anything else retries)
        message = error_line(err)
        _finish(run_id, sink, shipper, Status.FAILED, message, error=message)
        return Status.FAILED
    if run.status == Status.STARTING:
        services.transition(run_id, Status.RUNNING)
    how = "resumed" if continuing else "started"
    log.info("run %s %s at step %s (task %s)", run_id, how, run.step, task.request.id)
    _status_event(sink, Status.RUNNING, run.step, "resumed" if continuing else "started")
    try:
        # The object goes on to the runtime (its Ray actors get it too).
        if cfg.backend == "sim":  # replayed at the configured speed (0: as fast as it computes)
            sink.pace = cfg.sim.speed
        job_sink = JobSink(sink, shipper.event)  # the run's one terminal event is _finish's
        summary = run_job(
            cfg,
            sink=job_sink,
            workdir=workdir,
            should_stop=stop,
            resume=resume,
            progress=shipper.progress,
        )
    except Exception as err:
        log.exception("run %s failed", run_id)  # the traceback stays in the worker's log
        try:
            sink.flush()
        except Exception:  # the batch is dropped; the run must still be marked failed
            log.exception("run %s: its last events could not be stored", run_id)
        message = error_line(err)  # one line for Run.error and the event: no server paths
        _finish(
            run_id,
            sink,
            shipper,
            Status.FAILED,
            message,
            error=message,
            checkpoint_path=str(workdir),
        )
        return Status.FAILED
    sink.flush()
    if summary.get("status") == "cancelled":
        final = Status.PAUSED if stop.mode == "pause" else Status.CANCELLED
    elif summary.get("status") == "failed":
        final = Status.FAILED
    else:
        final = Status.SUCCEEDED
    error = str(summary.get("error", ""))
    _finish(run_id, sink, shipper, final, error, error=error, checkpoint_path=str(workdir))
    return final


def _finish(
    run_id: int, sink: DbSink, shipper: LogShipper, status: str, message: str = "", **fields: Any
) -> None:
    """The final status, the closing event, the log lines so far and the released GPUs
    commit together, so a reader who sees the run finished also sees its last event and
    its last log line."""
    with transaction.atomic():
        run = services.transition(run_id, status, **fields)
        said = f"run {run_id} {status} at step {run.step}" + (f": {message}" if message else "")
        log.log(logging.ERROR if status == Status.FAILED else logging.INFO, "%s", said)
        shipper.write_now()
        close_role_intervals(run_id=run_id, t=sink.last_t)
        release_gpus(run_id=run_id)
        _status_event(sink, status, run.step, message)


@app.task(time_limit=120)
def reap_stale_runs() -> int:
    """Resume or fail the active runs whose worker stopped heartbeating (the watchdog
    thread of every worker runs this too; beat's schedule is for deployments)."""
    return len(services.reap_stale_runs())


@app.task(time_limit=120)
def dispatch_launches() -> int:
    """Send the outbox's due launches (see ``services.dispatch_launches``)."""
    return services.dispatch_launches()


@app.task(time_limit=120)
def deliver_alerts() -> int:
    """Post the webhook deliveries that are due (``gyre_web.alerts.services.deliver_due``)."""
    from gyre_web.alerts.services import deliver_due

    return deliver_due()


def _sync_inventory_from_run() -> None:
    """A real run on a shared cluster (RAY_ADDRESS) connects this worker to Ray: refresh the
    inventory from here too, since a solo worker busy with a run takes no beat task."""
    ray = sys.modules.get("ray")  # a sim run never imports it
    if not settings.RAY_ADDRESS or ray is None or not ray.is_initialized():
        return
    from gyre_web.cluster.services import sync_inventory

    from gyre_core.runtime.inventory import read_inventory

    try:
        sync_inventory(nodes=[r.to_dict() for r in read_inventory()])
    except Exception:  # the inventory is a view: never fail a run over it
        log.exception("inventory sync from a run failed")


@app.task(time_limit=60)
def sync_ray_inventory() -> dict[str, int]:
    """Ray's view of the cluster into the Node and Gpu rows; a no-op without RAY_ADDRESS
    (each run then starts its own local Ray, which has no inventory worth keeping)."""
    from gyre_web.cluster.services import sync_inventory

    from gyre_core.runtime.inventory import read_inventory

    if not settings.RAY_ADDRESS:
        return {}
    records = read_inventory(str(settings.RAY_ADDRESS))
    return sync_inventory(nodes=[r.to_dict() for r in records])


EXPORT_TIME_LIMIT = 3600  # seconds one export may take


@app.task(time_limit=EXPORT_TIME_LIMIT + 60)
def export_checkpoint(export_id: int) -> str:
    """A run checkpoint as a Hugging Face directory: ``gyre export`` in a subprocess (it
    imports torch and transformers), written beside and renamed into place when whole."""
    paths = services.claim_export(export_id=export_id)
    if paths is None:
        return "skipped"
    out = Path(paths["out"])
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gyre_core.cli.main", "export", paths["checkpoint"],
            str(partial), "--model-dir", paths["model"], "--force"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=EXPORT_TIME_LIMIT)
    except subprocess.TimeoutExpired:
        services.finish_export(export_id=export_id, error=f"took over {EXPORT_TIME_LIMIT} s")
        return "failed"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
        error = lines[-1].replace(paths["run_folder"], "<run folder>")  # no server paths
        log.warning("export %s failed: %s", export_id, lines[-1])
        shutil.rmtree(partial, ignore_errors=True)
        services.finish_export(export_id=export_id, error=error)
        return "failed"
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    services.finish_export(export_id=export_id, size_bytes=size)
    return "done"
