"""Experiments, runs (with their status machine), metric points, benchmark scores and the
run's event log (a per-run sequence number, contiguous from 1)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Visibility(models.TextChoices):
    TEAM = "team"  # members of the team (and share links)
    PUBLIC = "public"  # also readable by every signed-in user


class Status(models.TextChoices):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# The status machine: every change goes through services.transition, which checks this.
# starting/running -> queued: the reaper requeues a run whose worker died (to resume it).
TRANSITIONS: dict[str, frozenset[str]] = {
    Status.QUEUED: frozenset({Status.STARTING, Status.CANCELLED}),
    Status.STARTING: frozenset(
        {Status.RUNNING, Status.FAILED, Status.CANCELLED, Status.PAUSED, Status.QUEUED}
    ),
    Status.RUNNING: frozenset(
        {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PAUSED, Status.QUEUED}
    ),
    Status.PAUSED: frozenset({Status.QUEUED, Status.CANCELLED}),
    Status.FAILED: frozenset({Status.QUEUED}),  # resume from the last checkpoint
    Status.CANCELLED: frozenset({Status.QUEUED}),
    Status.SUCCEEDED: frozenset(),
}
ACTIVE = frozenset({Status.QUEUED, Status.STARTING, Status.RUNNING})


class Source(models.TextChoices):
    LAUNCHED = "launched"
    REPORTED = "reported"


class Backend(models.TextChoices):
    REAL = "real"
    SIM = "sim"


class Experiment(models.Model):
    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    visibility = models.CharField(max_length=10, choices=Visibility.choices, default="team")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="experiment_name_in_team")
        ]

    def __str__(self) -> str:
        return self.name


class Run(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200, blank=True)
    config = models.JSONField()  # the validated snapshot (RunConfig.to_dict)
    policy = models.CharField(max_length=32)
    backend = models.CharField(max_length=8, choices=Backend.choices)
    seed = models.BigIntegerField(default=0)
    steps = models.IntegerField(default=0)  # planned
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED)
    step = models.IntegerField(default=0)  # reached
    error = models.TextField(blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    ray_job_id = models.CharField(max_length=64, blank=True)
    checkpoint_path = models.CharField(max_length=500, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    # A stop the job polls for: "" (none), "cancel" or "pause".
    stop_requested = models.CharField(max_length=8, blank=True)
    resume_requested = models.BooleanField(default=False)
    next_seq = models.BigIntegerField(default=1)  # the event log's next sequence number
    # "launched": a worker runs it; "reported": a run elsewhere (`gyre run --report-to`)
    # sends its events (runs/reporting.py), numbered by the reporter; reported_seq is the
    # last of those stored.
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.LAUNCHED)
    reported_seq = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["experiment", "-id"], name="run_by_experiment"),
            models.Index(fields=["status", "heartbeat_at"], name="run_by_status"),
        ]

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"


class LaunchOutbox(models.Model):
    """One launch message of a run (``launch_run`` with this Celery task id), written in
    the transaction that queues the run. Sent on commit; until ``sent_at`` is set the
    dispatcher (``services.dispatch_launches``) retries it, and it re-sends a launch
    whose run is still queued long after, in case the broker lost the message. The run's
    ``celery_task_id`` names its current launch; ``services.claim_launch`` makes a
    message that arrives twice launch the run once."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="launches")
    task_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.IntegerField(default=0)
    attempted_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["sent_at", "attempted_at"], name="launch_by_sent")]


class MetricPoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    name = models.CharField(max_length=100)
    step = models.IntegerField()
    value = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "name", "step"], name="one_point_per_step")
        ]


class MetricRollup(models.Model):
    """Min, max and last value of a metric over one block of ``2**level`` steps (the steps
    ``bucket * 2**level`` up to the next block), for levels 1..ROLLUP_LEVELS. Kept by
    ``services.append_events`` in the transaction that inserts the points, so that a
    downsampled series reads about ``points`` rows instead of every point."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_rollups")
    name = models.CharField(max_length=100)
    level = models.SmallIntegerField()
    bucket = models.BigIntegerField()  # step >> level
    min = models.FloatField()
    max = models.FloatField()
    last = models.FloatField()  # the value at last_step
    first_step = models.IntegerField()
    last_step = models.IntegerField()
    count = models.IntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name", "level", "bucket"], name="one_rollup_per_block"
            )
        ]


class BenchmarkScore(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="benchmarks")
    step = models.IntegerField()
    suite = models.CharField(max_length=100)
    score = models.FloatField()
    tasks = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "suite", "step"], name="one_score_per_step")
        ]


class RunEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    t = models.FloatField()  # seconds on the run's clock
    wall = models.DateTimeField()
    data = models.JSONField(default=dict)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="one_event_per_seq")]

    def as_message(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "t": self.t,
            "wall": self.wall.isoformat(),
            "data": self.data,
        }


class LogSource(models.TextChoices):
    RUNTIME = "runtime"  # the job: gyre_core's logging, progress lines, phase_progress
    WORKER = "worker"  # the Celery task that runs it (launch, finish, failure)


class LogLevel(models.TextChoices):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class RunLogLine(models.Model):
    """One line of a run's log (``runs/logs.py`` writes them: at most
    ``GYRE_RUN_LOG_MAX_LINES`` a run, each at most ``logs.MAX_LINE_CHARS``, NUL made ␀)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log_lines")
    seq = models.BigIntegerField()  # contiguous per run from 1
    time = models.DateTimeField()
    source = models.CharField(max_length=8, choices=LogSource.choices)
    level = models.CharField(max_length=8, choices=LogLevel.choices)
    text = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="one_log_line_per_seq")]

    def as_message(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "time": self.time.isoformat(),
            "source": self.source,
            "level": self.level,
            "text": self.text,
        }


class ExportStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class CheckpointExport(models.Model):
    """A run checkpoint written as a Hugging Face model directory by a worker (``gyre
    export`` in a subprocess: it imports torch, which the web never does); one per
    checkpoint version, asked again after a failure (``runs/exports.py``)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="exports")
    version = models.IntegerField()
    status = models.CharField(max_length=8, choices=ExportStatus.choices, default="queued")
    error = models.TextField(blank=True)
    size_bytes = models.BigIntegerField(default=0)
    task_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "version"], name="one_export_per_version")
        ]

    def as_message(self) -> dict[str, object]:
        return {
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "size_bytes": self.size_bytes,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
        }
