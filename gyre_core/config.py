"""The run configuration: typed, documented, validated once at the edge.

A config is nested sections of plain fields. Each section is defined beside the part that
owns it (``ClusterConfig`` in :mod:`gyre_core.cluster`, ``SchedulerConfig`` in
:mod:`gyre_core.scheduler.config`, ``RolloutConfig``, ``EngineConfig``, ``ModelConfig``, ``TrainConfig`` and
``SimConfig`` in the ``config`` module of rollout, models, train and sim, ``WarmStartConfig``
in :mod:`gyre_core.train.warm_start_config`, ``TrackingConfig``
in :mod:`gyre_core.tracking.config`), made of
:func:`~gyre_core.config_fields.config_field` fields, and composed here into ``RunConfig``,
which also re-exports them. ``RunConfig.from_dict`` checks every field and
reports *all* problems at once as ``ConfigError.errors`` — ``(path, message)`` pairs such
as ``("scheduler.policy", "must be one of colocate, async, elastic")`` — so the CLI and the
web form can show each next to its field. ``config_schema()`` describes every field (type,
default, choices, bounds, help) for the web form; ``gyre config show`` prints the defaults.

Files may be JSON, YAML or TOML (by extension); a partial file is merged over the defaults.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gyre_core.cluster import ClusterConfig
from gyre_core.config_fields import FLOAT_MAX, INT_MAX, STR_MAX, config_field
from gyre_core.errors import ConfigError
from gyre_core.jsonl import JsonBoundsError, loads
from gyre_core.models.config import ModelConfig
from gyre_core.models.shape import tiny_heads
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.engine_config import EngineConfig
from gyre_core.scheduler.config import SchedulerConfig
from gyre_core.scheduler.policies import fixed_split_policies
from gyre_core.sim.config import SimConfig
from gyre_core.sim.costs import CostModel
from gyre_core.tracking.config import TrackingConfig
from gyre_core.train.config import TrainConfig
from gyre_core.train.warm_start_config import MOVED, WarmStartConfig
from gyre_core.trajectory.paths import PathSampling, parse_roles
from gyre_core.trajectory.rewards import Weighting

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # no string field holds one (config_fields.py)
SIM_GPUS_PER_UNIT = CostModel().gpus_per_unit  # a simulated run's unit (backend: sim)

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "EngineConfig",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "SchedulerConfig",
    "SimConfig",
    "TrackingConfig",
    "TrainConfig",
    "WarmStartConfig",
    "config_schema",
    "default_config",
    "dump_config",
    "load_config",
    "scheduled_units",
]


@dataclass(frozen=True, slots=True)
class RunConfig:
    name: str = config_field("demo", "a label for the run", max_length=200)
    backend: str = config_field(
        "real", "real units on Ray, or the cluster simulator", choices=("real", "sim")
    )
    steps: int = config_field(8, "training steps", min=1, max=1_000_000)
    seed: int = config_field(0, "seed for tasks, sampling and initialisation", min=0)
    checkpoint_every: int = config_field(1, "steps between checkpoints", min=1)
    checkpoint_keep_last: int = config_field(
        0, "checkpoints kept, the newest first (0: all); the newest is never deleted", min=0
    )
    checkpoint_keep_every: int = config_field(
        0, "also keep every checkpoint whose step is a multiple of this (0: none)", min=0
    )
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def policy(self) -> str:
        return self.scheduler.policy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        errors: list[tuple[str, str]] = []
        cfg = _build(cls, data, "", errors)
        if not errors:
            errors.extend(_cross_checks(cfg))
        if errors:
            raise ConfigError(errors)
        assert isinstance(cfg, RunConfig)
        return cfg


def default_config() -> RunConfig:
    return RunConfig()


def _build(cls: type, data: Any, prefix: str, errors: list[tuple[str, str]]) -> Any:
    if not isinstance(data, dict):
        errors.append(
            (prefix.rstrip(".") or "<config>", f"expected a mapping, got {type(data).__name__}")
        )
        return cls()
    known = {f.name: f for f in fields(cls)}
    for key in data:
        if prefix + str(key) in MOVED:  # a field moved to another section: its new name
            errors.append((prefix + str(key), f"moved to {MOVED[prefix + str(key)]}"))
        elif key not in known:
            name = str(key) if len(str(key)) <= 60 else str(key)[:57] + "..."
            errors.append((prefix + name, f"unknown field (known: {', '.join(known)})"))
    values: dict[str, Any] = {}
    for name, f in known.items():
        path = prefix + name
        if f.default is MISSING:  # a nested section
            sub = f.default_factory
            values[name] = _build(sub, data.get(name, {}), path + ".", errors)  # type: ignore[arg-type]
            continue
        if name not in data:
            continue
        value, problem = _check(f, data[name])
        if problem:
            errors.append((path, problem))
        else:
            values[name] = value
    return cls(**values)


def _bounds(f: Any) -> dict[str, Any]:
    """A field's metadata with its type's bounds filled in where it declares none."""
    meta = dict(f.metadata)
    want = f.type if isinstance(f.type, str) else f.type.__name__
    if want == "int":
        meta.setdefault("min", -INT_MAX - 1)
        meta.setdefault("max", INT_MAX)
    elif want == "float":
        if "above" not in meta:
            meta.setdefault("min", -FLOAT_MAX)
        meta.setdefault("max", FLOAT_MAX)
    elif want == "str" and "choices" not in meta:
        meta.setdefault("max_length", STR_MAX)
    return meta


def _check(f: Any, value: Any) -> tuple[Any, str]:
    want = f.type if isinstance(f.type, str) else f.type.__name__
    if want == "str" and isinstance(value, bool) and "on" in f.metadata.get("choices", ()):
        value = "on" if value else "off"  # YAML reads an unquoted on/off as a boolean
    if want == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return None, f"expected an integer, got {_short(value)}"
    if want == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, f"expected a number, got {_short(value)}"
        if isinstance(value, int) and abs(value) > FLOAT_MAX:
            return None, f"must be at most {FLOAT_MAX:g} in size"
        value = float(value)
        if not math.isfinite(value):
            return None, f"expected a finite number, got {value!r}"
    if want == "bool" and not isinstance(value, bool):
        return None, f"expected true or false, got {_short(value)}"
    if want == "str" and not isinstance(value, str):
        return None, f"expected a string, got {_short(value)}"
    meta = _bounds(f)
    if want == "str":
        if "max_length" in meta and len(value) > meta["max_length"]:
            return None, f"longer than {meta['max_length']} characters ({len(value)})"
        bad = _CONTROL.search(value)
        if bad:
            return None, f"contains the control character {bad.group()!r}"
    if "choices" in meta and value not in meta["choices"]:
        return None, f"must be one of {', '.join(meta['choices'])}, got {_short(value)}"
    if "min" in meta and value < meta["min"]:
        return None, f"must be >= {meta['min']}, got {_short(value)}"
    if "above" in meta and value <= meta["above"]:
        return None, f"must be > {meta['above']}, got {value!r}"
    if "max" in meta and value > meta["max"]:
        return None, f"must be <= {meta['max']}, got {_short(value)}"
    return value, ""


def _short(value: Any) -> str:
    """A value as an error shows it: at most 40 characters (a 1 MB string is not echoed)."""
    if isinstance(value, int) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def scheduled_units(cfg: RunConfig) -> int:
    """The units the run's policy schedules: ``cluster.units`` on a real run; on a simulated
    one ``sim.gpus`` cut into the simulated cost model's units."""
    if cfg.backend == "sim":
        return cfg.sim.gpus // SIM_GPUS_PER_UNIT
    return cfg.cluster.units


def _cross_checks(cfg: RunConfig) -> list[tuple[str, str]]:
    """Rules between fields, each reported on the field to change: what the runtime would
    refuse about a config's values is refused here, before a run is queued."""
    errors = []
    s = cfg.scheduler
    if cfg.backend == "sim":
        g, unit = cfg.sim.gpus, SIM_GPUS_PER_UNIT
        if g % unit or g < 2 * unit:
            problem = f"must be a multiple of {unit} (a simulated unit), at least {2 * unit}"
            errors.append(("sim.gpus", f"{problem}, got {g}"))
        if cfg.sim.rollouts < cfg.sim.rollouts_per_step:
            errors.append(("sim.rollouts", "fewer than one step of sim.rollouts_per_step"))
        group, per_step = cfg.rollout.group_size, cfg.sim.rollouts_per_step
        if group < per_step and per_step % group:  # refused, not warned: a step of part
            # of a group would train it apart (advantages against a part's mean)
            problem = f"must be a multiple of rollout.group_size ({group})"
            why = "a step trains whole groups"
            errors.append(("sim.rollouts_per_step", f"{problem}, got {per_step}: {why}"))
    units = scheduled_units(cfg)
    fixed = fixed_split_policies()
    if s.rollout_units and s.policy not in fixed:
        problem = f"applies to policy {' or '.join(fixed)} only"
        errors.append(("scheduler.rollout_units", f"{problem}, not {s.policy}"))
    if units >= 2 and s.rollout_units >= units:
        errors.append(("scheduler.rollout_units", f"must leave >= 1 of {units} units to train"))
    m = cfg.model
    heads = tiny_heads(m.hidden_size)  # the tiny model's query heads (models/shape.py)
    if not m.checkpoint and heads % m.kv_heads:
        problem = f"must divide the tiny model's query heads (model.hidden_size // 32 = {heads})"
        errors.append(("model.kv_heads", f"{problem}, got {m.kv_heads}"))
    t, w = cfg.train, cfg.warm_start
    if t.ratio_cap and not t.ratio_cap > 1 + t.clip_high:
        problem = f"must be > 1 + train.clip_high ({1 + t.clip_high:g}) or 0, got {t.ratio_cap:g}"
        errors.append(("train.ratio_cap", problem))
    if w.settle_loss and not w.anneal_steps:
        problem = "needs warm_start.anneal_steps > 0 (the length of a round)"
        errors.append(("warm_start.settle_loss", problem))
    demos = w.steps and not w.weights and not w.data
    if w.data and w.weights:
        errors.append(("warm_start.data", "set warm_start.weights or this, not both"))
    if demos and w.skip_check and cfg.rollout.suite != "repo":
        problem = "needs rollout.suite repo (whose components end in a check)"
        errors.append(("warm_start.skip_check", f"{problem}, not {cfg.rollout.suite}"))
    if t.offpolicy_data and cfg.scheduler.staleness_bound < 1:
        problem = "needs scheduler.staleness_bound >= 1 (imported tokens count one version old)"
        errors.append(("train.offpolicy_data", problem))
    r = cfg.rollout
    if r.agent and r.agent_command:
        errors.append(("rollout.agent_command", "set rollout.agent or this, not both"))
    for name in ("agent", "env", "reward_fn"):
        value = getattr(r, name)
        module, sep, attr = value.partition(":")
        if value and not (sep and module and attr):
            errors.append((f"rollout.{name}", f"expected 'package.module:name', got {value!r}"))
    try:
        shlex.split(r.agent_command)
    except ValueError as e:
        errors.append(("rollout.agent_command", f"not a command line: {e}"))
    return errors + _roles_problem(cfg) + _streaming_problems(cfg)


def _streaming_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """What ``scheduler.streaming`` needs of the other fields."""
    s, errors = cfg.scheduler, []
    if s.streaming and cfg.backend == "sim" and s.batch_order != "arrival":
        problem = "takes groups as they finish: needs scheduler.batch_order arrival"
        errors.append(("scheduler.streaming", problem))
    if s.streaming and cfg.backend != "sim":
        if cfg.cluster.gpus_per_unit != 1:
            problem = "needs cluster.gpus_per_unit 1 (a streaming unit holds the whole model)"
            errors.append(("scheduler.streaming", f"{problem}, got {cfg.cluster.gpus_per_unit}"))
        if cfg.engine.weight_sync == "nccl":
            problem = "sends the core's weights through the object store: set engine.weight_sync"
            errors.append(("scheduler.streaming", f"{problem} to a value other than nccl"))
    return errors


def _roles_problem(cfg: RunConfig) -> list[tuple[str, str]]:
    try:
        parse_roles(cfg.train.path_roles)
    except ValueError as e:
        return [("train.path_roles", str(e))]
    return []


def config_schema() -> dict[str, Any]:
    """Every field: ``{"path": {"type", "default", "help", "choices"?, "min"?, "max"?,
    "above"?}}``."""
    out: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        for f in fields(cls):
            if f.default is MISSING:
                walk(f.default_factory, prefix + f.name + ".")  # type: ignore[arg-type]
                continue
            entry = {"type": f.type if isinstance(f.type, str) else f.type.__name__}
            entry.update({"default": f.default, **_bounds(f)})
            if "choices" in entry:
                entry["choices"] = list(entry["choices"])
            out[prefix + f.name] = entry

    walk(RunConfig, "")
    return out


def resolve_paths(cfg: RunConfig, base: Path) -> RunConfig:
    """``cfg`` with every relative path field (``path=True``: a checkpoint, a warm-start
    weights file, the warm-start cache) joined to ``base``; empty and absolute ones stay."""
    sections = {}
    for sec in fields(cfg):
        if sec.default is not MISSING:
            continue
        section = getattr(cfg, sec.name)
        moved = {
            f.name: str(base / getattr(section, f.name))
            for f in fields(section)
            if f.metadata.get("path")
            and getattr(section, f.name)
            and not Path(getattr(section, f.name)).is_absolute()
        }
        if moved:
            sections[sec.name] = replace(section, **moved)
    return replace(cfg, **sections) if sections else cfg


def load_config(path: str | Path, base: Path | None = None) -> RunConfig:
    """Read a JSON, YAML or TOML file (by extension) and validate it over the defaults. Its
    relative paths are made absolute against ``base`` (default: the current directory), so
    every process a run starts (a worker, Ray actors) reads the same files whatever its own
    directory."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = loads(text)
        else:
            raise ConfigError([("<file>", f"{p}: unknown extension (use .json, .yaml or .toml)")])
    except ConfigError:
        raise
    except (JsonBoundsError, yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError([("<file>", f"{p}: cannot parse: {str(exc).splitlines()[0]}")]) from None
    except (RecursionError, ValueError):  # YAML/TOML nested too deep, a 5,000-digit int
        raise ConfigError(
            [("<file>", f"{p}: cannot parse: nested too deep or a number too long")]
        ) from None
    return resolve_paths(RunConfig.from_dict(data), base or Path.cwd())


def dump_config(cfg: RunConfig, fmt: str = "yaml") -> str:
    data = cfg.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        return str(yaml.safe_dump(data, sort_keys=False))
    raise ValueError(f"format must be json or yaml, got {fmt!r}")


def run_weighting(config: Mapping[str, Any]) -> Weighting:
    """The weighting a run's trainer uses: that of the ``train`` section of its config
    snapshot (``RunConfig.to_dict``), rebuilt by ``RunConfig.from_dict`` as the run's worker
    rebuilds it (a snapshot that is refused raises its ``ConfigError``). The tree browser
    weighs a run's trees with it (``gyre_core.trajectory.export``)."""
    return RunConfig.from_dict(dict(config)).train.weighting


def run_path_sampling(config: Mapping[str, Any]) -> tuple[PathSampling, int]:
    """The path sampling a run's trainer uses and the run's seed, from its config snapshot
    as :func:`run_weighting` reads it: the tree browser marks the paths each step took."""
    cfg = RunConfig.from_dict(dict(config))
    return cfg.train.path_sampling, cfg.seed


assert is_dataclass(RunConfig)
