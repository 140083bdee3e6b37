"""What a config that arrives through the platform may name (docs/platform.md, "What a web
config may name"). One decision, taken by the web (create, fork, sweep, resume) and again
by the worker at every launch under its own settings: code only from the operator's
allow-list, files only as the team's objects (``dataset:<id>``, ``checkpoint:<run>@<v>``)
or under the operator's roots, addresses only as the operator's settings. Anything else is
refused by field. ``gyre run`` on a terminal never comes here: the rule is the platform's.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.conf import settings

from gyre_core.config import RunConfig
from gyre_web.runs.models import CheckpointExport, ExportStatus, Run, Source

# Code the workers import and call.
CODE = ("rollout.env", "rollout.reward_fn", "rollout.agent")
# External agents: code or a command line, only where the operator allows them at all.
AGENTS = ("rollout.agent", "rollout.agent_command")
# Files read, with the team-owned reference each also takes (None: a path only).
DATASET, CHECKPOINT = "dataset", "checkpoint"
READ = {
    "rollout.tasks": DATASET,
    "warm_start.data": DATASET,
    "train.offpolicy_data": DATASET,
    "model.checkpoint": CHECKPOINT,
    "warm_start.weights": None,
}
# What kind of uploaded dataset each field reads (gyre_web.datasets).
DATASET_KINDS = {
    "rollout.tasks": "tasks",
    "warm_start.data": "trajectories",
    "train.offpolicy_data": "trajectories",
}
WRITE = ("warm_start.cache",)  # a folder the run writes
# Addresses: the operator's setting for each ('' in a config: the setting applies).
ADDRESSES = {
    "cluster.ray_address": "RAY_ADDRESS",
    "tracking.mlflow_tracking_uri": "GYRE_MLFLOW_TRACKING_URI",
}
# The free-text fields that are none of the above (labels, names).
FREE = (
    "name",
    "rollout.agent_command",
    "rollout.task_split_field",
    "tracking.mlflow_experiment",
    "tracking.wandb_project",
    "train.path_roles",  # a comma-separated list of four role names, checked by the config
)
_REFERENCE = re.compile(r"^(\w+):(.*)$")
_CHECKPOINT = re.compile(r"^checkpoint:([0-9]{1,12})(?:@([0-9]{1,12}))?$")
_DATASET = re.compile(r"^dataset:([0-9]{1,12})$")


class ConfigInvalid(ValueError):
    """The run config failed validation; ``errors`` = [(field path, message)]."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in errors))
        self.errors = errors


class Refused(ValueError):
    pass


def plugins() -> frozenset[str]:
    """The operator's allow-list: installed ``gyre.plugins`` entry points and GYRE_PLUGINS."""
    eps = importlib.metadata.entry_points(group="gyre.plugins")
    found = {f"{ep.module}:{ep.attr}" for ep in eps if ep.attr}
    return frozenset(found | set(settings.GYRE_PLUGINS))


def enforce(cfg: RunConfig, *, team_id: int | None, user: Any = None) -> RunConfig:
    """``cfg`` checked under this process's settings for a run of team ``team_id`` launched
    by ``user``; raises ConfigInvalid naming every refused field. -> the config to execute:
    references resolved to paths, relative paths made absolute (against this process's
    directory, as the run would read them), the operator's addresses filled in."""
    errors: list[tuple[str, str]] = []
    changes: dict[str, str] = {}
    agents = settings.GYRE_EXTERNAL_AGENTS
    for field in AGENTS:
        if _get(cfg, field) and not agents:
            errors.append((field, "external agents run code on the workers; this platform "
                                  "does not allow them (GYRE_EXTERNAL_AGENTS)"))  # fmt: skip
    named = [(f, _get(cfg, f)) for f in CODE if _get(cfg, f) and (agents or f not in AGENTS)]
    allowed = plugins() if named else frozenset()
    errors += [
        (f, f"{v!r} is not one of this platform's plugins (the operator lists them: the "
            "gyre.plugins entry points of installed packages, and GYRE_PLUGINS)")
        for f, v in named if v not in allowed
    ]  # fmt: skip
    for field, kind in READ.items():
        how = lambda v, k=kind, f=field: _read(v, k, team_id, user, f)  # noqa: E731
        _decide(errors, changes, field, how, cfg)
    roots = settings.GYRE_CACHE_ROOTS
    for field in WRITE:
        _decide(errors, changes, field, lambda v: _under(v, roots, "GYRE_CACHE_ROOTS"), cfg)
    for field, setting in ADDRESSES.items():
        value, mine = _get(cfg, field), str(getattr(settings, setting) or "")
        if value and value != mine:
            errors.append((field, f"runs here use the operator's address: leave it empty "
                                  f"({setting} applies)"))  # fmt: skip
        else:
            changes[field] = mine
    if errors:
        raise ConfigInvalid(errors)
    return _with(cfg, changes)


def runnable(run: Run) -> RunConfig:
    """The stored config of ``run`` as this worker executes it (``enforce`` under the
    worker's settings). Raises ConfigError (gyre_core) or ConfigInvalid."""
    cfg = RunConfig.from_dict(run.config)
    return enforce(cfg, team_id=run.experiment.team_id, user=run.created_by)


def model_folder(run: Run) -> str:
    """The model ``run`` started from as a folder here ('' = its own, or one the platform
    does not read: a reported run's path is its reporter's, and roots apply)."""
    value = str((run.config.get("model") or {}).get("checkpoint") or "")
    if not value or run.source != Source.LAUNCHED:
        return ""
    try:
        return str(_read(value, CHECKPOINT, run.experiment.team_id, run.created_by, ""))
    except Refused:
        return ""


def _decide(errors: list[Any], changes: dict[str, str], field: str, how: Any, cfg: Any) -> None:
    value = _get(cfg, field)
    if not value:
        return
    try:
        changes[field] = str(how(value))
    except Refused as err:
        errors.append((field, str(err)))


def _read(value: str, kind: str | None, team_id: int | None, user: Any, field: str) -> Path:
    ref = _REFERENCE.match(value)
    if ref and ref[1] in (DATASET, CHECKPOINT):
        if ref[1] != kind:
            raise Refused(f"takes no {ref[1]} reference")
        if kind == DATASET:
            return _dataset(value, team_id, DATASET_KINDS[field])
        return _checkpoint(value, team_id)
    return _under(value, settings.GYRE_DATA_ROOTS, "GYRE_DATA_ROOTS", kind)


def _under(value: str, roots: Any, setting: str, kind: str | None = None) -> Path:
    try:
        path = (Path.cwd() / value).resolve()  # an absolute value stays; symlinks followed
    except (OSError, ValueError, RuntimeError):
        raise Refused("not a usable path") from None
    if any(path.is_relative_to(Path(root).resolve()) for root in roots):
        return path
    other = f", or name {'an uploaded dataset' if kind == DATASET else 'a checkpoint'} " \
        f"('{kind}:<id>')" if kind else ""  # fmt: skip
    raise Refused(f"not under a folder this platform's runs may use ({setting}){other}")


def _dataset(value: str, team_id: int | None, wanted: str) -> Path:
    m = _DATASET.match(value)
    if m is None:
        raise Refused("name a dataset as 'dataset:<id>'")
    try:
        from gyre_web.datasets.selectors import dataset_kind, dataset_path
    except ImportError:
        raise Refused("this platform keeps no uploaded datasets") from None
    try:
        if team_id is None:
            raise LookupError
        kind = dataset_kind(team_id=team_id, dataset_id=int(m[1]))
        path = Path(dataset_path(team_id=team_id, dataset_id=int(m[1])))
    except LookupError:
        raise Refused(f"the run's team has no dataset {m[1]}") from None
    if kind != wanted:
        raise Refused(f"dataset {m[1]} holds {kind}; this field reads {wanted}")
    return path


def _checkpoint(value: str, team_id: int | None) -> Path:
    from gyre_web.runs.paths import export_dir

    m = _CHECKPOINT.match(value)
    if m is None:
        raise Refused(
            "name a checkpoint as 'checkpoint:<run id>' or 'checkpoint:<run id>@<version>'"
        )
    # The run's own team only: a public experiment shows its runs to outsiders, never its
    # weights (an export's download is for team members alone).
    own = Run.objects.filter(experiment__team_id=team_id, pk=int(m[1]), source=Source.LAUNCHED)
    run = own.first()
    if run is None:
        raise Refused(f"the run's team has no launched run {m[1]} to take a checkpoint from")
    done = CheckpointExport.objects.filter(run=run, status=ExportStatus.DONE)
    if m[2] is not None:
        done = done.filter(version=int(m[2]))
    export = done.order_by("-version").first()
    path = export_dir(run.pk, export.version) if export is not None else None
    if path is None or not path.is_dir():
        which = f"checkpoint {m[2]}" if m[2] is not None else "checkpoint"
        raise Refused(f"run {run.pk} has no exported {which} (export it first: "
                      f"POST /api/runs/{run.pk}/checkpoints/<version>/export/)")  # fmt: skip
    return path


def _get(cfg: Any, field: str) -> str:
    for part in field.split("."):
        cfg = getattr(cfg, part)
    return str(cfg or "")


def _with(cfg: RunConfig, changes: dict[str, str]) -> RunConfig:
    sections: dict[str, dict[str, str]] = {}
    for field, value in changes.items():
        if _get(cfg, field) != value:
            section, _, name = field.partition(".")
            sections.setdefault(section, {})[name] = value
    moved = {s: replace(getattr(cfg, s), **v) for s, v in sections.items()}
    return replace(cfg, **moved) if moved else cfg
