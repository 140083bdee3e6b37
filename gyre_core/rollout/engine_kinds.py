"""The registry of engine kinds: what can serve a unit's rollout role (``model.engine``'s
choices). Light on purpose: the config imports it for the choices, so each kind's
implementation is imported only when a run makes a host of that kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_core.registry import Registry
from gyre_core.rollout.engine import EngineHost


def _ready() -> None:
    """Nothing to check: the engine needs only this process's packages."""


def _no_settings(cfg: Any, model_dir: Path, cuda: bool) -> Any:
    """Nothing to resolve: the engine takes no settings of its own (and no weights over
    NCCL: ``engine.weight_sync: nccl`` is vLLM's receiver)."""
    if getattr(getattr(cfg, "engine", None), "weight_sync", "") == "nccl":
        from gyre_core.errors import ConfigError

        engine = getattr(getattr(cfg, "model", None), "engine", "?")
        raise ConfigError([("engine.weight_sync", f"nccl needs model.engine vllm, got {engine}")])
    return None


@dataclass(frozen=True, slots=True)
class EngineKind:
    """An engine kind. ``check()`` raises ``ValueError`` saying what to install when the
    kind cannot run here (a run calls it before any work); ``settings(cfg, model_dir,
    cuda)`` resolves the run config for this kind once, when a run starts, raising
    ``ConfigError`` for what cannot work; ``host(unit, checkpoint, work_dir, settings)``
    makes a unit's host from them."""

    host: Callable[[int, str, str, Any], EngineHost]
    check: Callable[[], None] = _ready
    settings: Callable[[Any, Path, bool], Any] = _no_settings


ENGINES: Registry[EngineKind] = Registry("engine")
register_engine = ENGINES.register


def _torch_host(unit: int, checkpoint: str, work_dir: str, settings: Any) -> EngineHost:
    from gyre_core.rollout.torch_engine import TorchHost

    return TorchHost(checkpoint)


def _vllm_host(unit: int, checkpoint: str, work_dir: str, settings: Any) -> EngineHost:
    if not work_dir:
        raise ValueError("a vllm unit needs a work_dir")
    from gyre_core.rollout.vllm_unit import VLLMUnit

    return VLLMUnit(unit, checkpoint, Path(work_dir) / f"unit-{unit}", settings)


def _vllm_check() -> None:
    from gyre_core.rollout.vllm_unit import check_vllm_env

    check_vllm_env()


def _vllm_settings(cfg: Any, model_dir: Path, cuda: bool) -> Any:
    from gyre_core.rollout.vllm_env import DEFAULT_VENV, venv_target
    from gyre_core.rollout.vllm_settings import resolve, visible_gpu_bytes

    gpu_bytes = visible_gpu_bytes() if cuda else 0  # sizes the KV cache and sequence cap
    return resolve(cfg, model_dir, cuda, venv_target(DEFAULT_VENV), gpu_bytes)


# torch: an in-process TorchEngine; vllm: a vLLM server per rollout unit with the run's
# engine settings (gyre_core.rollout.vllm_unit).
register_engine("torch")(EngineKind(_torch_host))
register_engine("vllm")(EngineKind(_vllm_host, _vllm_check, _vllm_settings))
