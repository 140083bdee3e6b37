"""Sweep writes: create (every run's config validated before anything is stored), launch
up to the cap, launch the next runs when one leaves the active states, and cancel.

The cap: a sweep's run counts against ``max_concurrent`` from its launch (a row in the
launch outbox) until it leaves queued/starting/running. Every launch happens under the
sweep's row lock, after counting, so two runs ending at once never launch past the cap.
``run_left_active`` is a ``runs.hooks`` receiver (registered in the app's ready), called
by ``runs.lifecycle.transition`` in the transaction that ends the run (a run never ends
without its successor launched, whatever worker dies after), and ``advance_due`` (every
worker's watchdog) catches up on anything left. The sweep lock is taken after a run's
lock, never before one is waited for: pending runs are locked with skip_locked."""

from __future__ import annotations

import contextlib
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from gyre_web.runs import services as runs
from gyre_web.runs.models import ACTIVE, Experiment, LaunchOutbox, Run, Status
from gyre_web.sweeps import expand
from gyre_web.sweeps.expand import MAX_RUNS, SpecInvalid, param_key
from gyre_web.sweeps.models import Mode, Sweep, SweepRun

__all__ = ["SpecInvalid", "advance", "advance_due", "cancel_sweep", "create_sweep"]


def _launched() -> Exists:
    return Exists(LaunchOutbox.objects.filter(run=OuterRef("pk")))


def active_started(sweep_id: int) -> int:
    """The sweep's runs launched and not yet out of queued/starting/running."""
    rows = Run.objects.filter(sweep_run__sweep_id=sweep_id, status__in=ACTIVE)
    return rows.filter(_launched()).count()


def _pending(sweep_id: int) -> Any:
    rows = Run.objects.filter(sweep_run__sweep_id=sweep_id, status=Status.QUEUED)
    return rows.filter(~_launched()).order_by("sweep_run__index")


def _values(mode: str, params: Any, samples: int, seed: int) -> list[dict[str, Any]]:
    if mode == Mode.GRID:
        return expand.grid(params)
    if mode == Mode.RANDOM:
        return expand.random_samples(params, samples, seed)
    raise SpecInvalid([("mode", "grid or random")])


def _configs(
    base: dict[str, Any], values: list[dict[str, Any]], **who: Any
) -> list[dict[str, Any]]:
    """Each run's config, every one validated (``who``: the team and the user it is run
    for); a swept field's error names its param."""
    errors: dict[str, str] = {}
    configs = []
    for i, vals in enumerate(values):
        config = base
        for path, value in vals.items():
            config = runs.deep_merge(config, expand.nested(path, value))
        try:
            runs.validate_config(config, **who)
        except runs.ConfigInvalid as err:
            for field, message in err.errors:
                swept = [p for p in vals if field == p or field.startswith(p + ".")]
                key = param_key(swept[0]) if swept else "params"
                shown = (
                    f"{vals[swept[0]]!r}: {message}" if swept else f"run {i + 1} {field}: {message}"
                )
                errors.setdefault(key, shown)
        configs.append(config)
    if errors:
        raise SpecInvalid(sorted(errors.items()))
    return configs


@transaction.atomic
def create_sweep(
    *,
    experiment: Experiment,
    base_config: dict[str, Any],
    mode: str,
    params: Any,
    max_concurrent: int,
    samples: int = 0,
    seed: int = 0,
    name: str = "",
    created_by: Any = None,
) -> Sweep:
    """The sweep and all its runs (queued), the first ``max_concurrent`` launched on
    commit. Raises ConfigInvalid for a bad base config, SpecInvalid for a bad spec or a
    generated config the validator refuses; nothing is stored then."""
    if not 1 <= max_concurrent <= MAX_RUNS:
        raise SpecInvalid([("max_concurrent", f"between 1 and {MAX_RUNS}")])
    who = {"team_id": experiment.team_id, "user": created_by}
    runs.validate_config(base_config, **who)
    values = _values(mode, params, samples, seed)
    configs = _configs(base_config, values, **who)
    sweep = Sweep.objects.create(
        experiment=experiment, name=name, base_config=base_config, mode=mode, params=params,
        samples=samples if mode == Mode.RANDOM else 0, seed=seed if mode == Mode.RANDOM else 0,
        max_concurrent=max_concurrent, created_by=created_by,
    )  # fmt: skip
    label = name or f"sweep {sweep.pk}"
    for i, (vals, config) in enumerate(zip(values, configs, strict=True)):
        run = runs.create_run(
            experiment=experiment, config=config, created_by=created_by,
            name=f"{label} #{i + 1}"[:200], launch=False,
        )  # fmt: skip
        SweepRun.objects.create(sweep=sweep, run=run, index=i, values=vals)
    advance(sweep.pk)
    return sweep


@transaction.atomic
def advance(sweep_id: int) -> list[int]:
    """Launch the sweep's next pending runs while fewer than its cap are active (a
    cancelled sweep's pending runs are cancelled instead). Idempotent. -> those runs' ids."""
    sweep = Sweep.objects.select_for_update().filter(pk=sweep_id).first()
    if sweep is None:
        return []
    pending = _pending(sweep_id).select_for_update(skip_locked=True, of=("self",))
    if sweep.cancelled_at is not None:
        ended = [run.pk for run in pending]
        for run_id in ended:  # (the hook leaves a cancelled sweep alone)
            runs.transition(run_id, Status.CANCELLED)
        return ended
    slots = sweep.max_concurrent - active_started(sweep_id)
    launched = []
    for run in pending[: max(0, slots)]:
        runs.queue_launch(run)
        launched.append(run.pk)
    return launched


def run_left_active(run: Run) -> None:
    """A run left queued/starting/running: if a sweep's, its next run may start."""
    live = SweepRun.objects.filter(run_id=run.pk, sweep__cancelled_at__isnull=True)
    sweep_id = live.values_list("sweep_id", flat=True).first()
    if sweep_id is not None:  # a cancelled sweep's pending runs are cancel_sweep's
        advance(sweep_id)


def advance_due(*, limit: int = 50) -> int:
    """Advance the sweeps with pending runs (a catch-up: the transition hook does this
    as runs end). -> runs launched or cancelled."""
    pending = SweepRun.objects.filter(run__status=Status.QUEUED).filter(
        ~Exists(LaunchOutbox.objects.filter(run=OuterRef("run")))
    )
    ids = pending.values_list("sweep_id", flat=True).distinct().order_by("sweep_id")[:limit]
    return sum(len(advance(sweep_id)) for sweep_id in list(ids))


def cancel_sweep(*, sweep: Sweep) -> Sweep:
    """Stop the sweep: no more launches, its pending runs cancelled, its active and paused
    runs asked to cancel. Idempotent (a second call cancels what a first one missed)."""
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep.pk)
        if sweep.cancelled_at is None:
            sweep.cancelled_at = timezone.now()
            sweep.save(update_fields=["cancelled_at"])
    advance(sweep.pk)  # the pending runs
    live = Run.objects.filter(sweep_run__sweep=sweep, status__in=[*ACTIVE, Status.PAUSED])
    for run in live.order_by("pk"):
        with contextlib.suppress(runs.IllegalTransition):  # it ended meanwhile
            runs.request_stop(run=run, mode="cancel")
    return sweep
