"""Experiments and runs: creation (the config validated by gyre_core and the operator's
``config_policy``), fork, and the config a worker executes. A run created with
``launch=True`` is launched through the outbox (``launch.queue_launch``)."""

from __future__ import annotations

import copy
from typing import Any

from django.db import transaction

from gyre_web.runs import config_policy
from gyre_web.runs.config_policy import ConfigInvalid
from gyre_web.runs.launch import queue_launch
from gyre_web.runs.models import Experiment, Run, Source


def validate_config(
    config: Any, *, runs_here: bool = True, team_id: int | None = None, user: Any = None
) -> Any:
    """-> gyre_core RunConfig, or ConfigInvalid listing every bad field. ``runs_here``:
    the platform's workers would run it, so what it may name is the operator's rule
    (``config_policy``) for a run of team ``team_id`` launched by ``user``; a reported run
    runs elsewhere, its plugins, paths and agents are its reporter's business."""
    from gyre_core.config import ConfigError, RunConfig

    if not isinstance(config, dict):
        raise ConfigInvalid([("config", "must be an object")])
    try:
        cfg = RunConfig.from_dict(config)
    except ConfigError as err:
        raise ConfigInvalid(list(err.errors) or [("config", str(err))]) from None
    if runs_here:
        config_policy.enforce(cfg, team_id=team_id, user=user)  # the stored config keeps its names
    return cfg


def runnable_config(run: Run) -> Any:
    """The config a worker executes for ``run``: decided again under the worker's own
    settings (``config_policy.runnable``; raises ConfigInvalid or gyre_core's ConfigError)."""
    return config_policy.runnable(run)


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@transaction.atomic
def create_experiment(
    *,
    team: Any,
    name: str,
    created_by: Any = None,
    description: str = "",
    tags: list[str] | None = None,
    visibility: str = "team",
) -> Experiment:
    return Experiment.objects.create(
        team=team,
        name=name,
        description=description,
        tags=list(tags or []),
        visibility=visibility,
        created_by=created_by,
    )


@transaction.atomic
def create_run(
    *,
    experiment: Experiment,
    config: dict[str, Any],
    created_by: Any = None,
    name: str = "",
    parent: Run | None = None,
    launch: bool = True,
    source: str = Source.LAUNCHED,
) -> Run:
    cfg = validate_config(
        config, runs_here=source == Source.LAUNCHED, team_id=experiment.team_id, user=created_by
    )
    run = Run.objects.create(
        source=source,
        experiment=experiment,
        name=name,
        config=cfg.to_dict(),
        policy=cfg.policy,
        backend=cfg.backend,
        seed=cfg.seed,
        steps=cfg.steps,
        parent=parent,
        created_by=created_by,
    )
    if launch:
        queue_launch(run)
    return run


@transaction.atomic
def fork_run(*, run: Run, changes: dict[str, Any], created_by: Any = None, name: str = "") -> Run:
    """A new run from a copy of ``run``'s config with ``changes`` merged in, parent linked."""
    config = deep_merge(run.config, changes)
    return create_run(
        experiment=run.experiment,
        config=config,
        created_by=created_by,
        name=(name or f"{run.name or f'run {run.pk}'} (fork)")[:200],  # Run.name's max_length
        parent=run,
    )
