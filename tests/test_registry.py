"""Registries feed the config: what is registered is what a config accepts, an unknown name
is refused by the config naming its field, and the validated sections are immutable."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from gyre_core.config import ConfigError, RunConfig, config_schema
from gyre_core.registry import Registry
from gyre_core.rollout.engine_kinds import ENGINES, EngineKind, register_engine
from gyre_core.scheduler.policies import POLICIES
from gyre_core.train.losses import LOSSES
from gyre_core.trajectory.rewards import ADVANTAGE_MODES, Weighting, register_advantage_mode


@pytest.fixture
def scratch(monkeypatch):
    """Registrations made inside a test are dropped after it (the registries are global)."""

    def keep(registry: Registry) -> None:
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))

    for registry in (ENGINES, ADVANTAGE_MODES):
        keep(registry)


def test_registry_refuses_a_second_name_and_lists_the_known_ones() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("a")(1)
    reg.register("b")(2)
    assert list(reg) == ["a", "b"] and reg.lookup("b") == 2 and "a" in reg
    with pytest.raises(ValueError, match="a widget named 'a' is already registered"):
        reg.register("a")(3)
    with pytest.raises(ValueError, match="unknown widget 'c'; expected one of a, b"):
        reg.lookup("c")


@pytest.mark.parametrize(
    ("path", "registry"),
    [
        ("scheduler.policy", POLICIES),
        ("model.engine", ENGINES),
        ("train.advantage_mode", ADVANTAGE_MODES),
    ],
)
def test_the_config_takes_its_choices_from_the_registry(path, registry) -> None:
    assert config_schema()[path]["choices"] == list(registry)
    section, name = path.split(".")
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({section: {name: "nope"}})
    errors = dict(err.value.errors)
    assert list(errors) == [path]
    assert f"must be one of {', '.join(registry)}, got 'nope'" == errors[path]


def test_registering_a_name_makes_the_config_accept_it(scratch) -> None:
    with pytest.raises(ConfigError):
        RunConfig.from_dict({"model": {"engine": "remote"}})
    register_engine("remote")(EngineKind(ENGINES.lookup("torch").host))
    assert RunConfig.from_dict({"model": {"engine": "remote"}}).model.engine == "remote"
    assert "remote" in config_schema()["model.engine"]["choices"]

    @register_advantage_mode("first")
    def _first(tree):
        return lambda node, rs, adv: float(adv[rs[0]])

    cfg = RunConfig.from_dict({"train": {"advantage_mode": "first"}})
    assert cfg.train.weighting == Weighting("first", False)


def test_weighting_and_losses_refuse_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown advantage mode 'mean'"):
        Weighting("mean", False)
    with pytest.raises(ValueError, match="unknown loss 'dpo'"):
        LOSSES.lookup("dpo")


def test_validated_sections_are_immutable() -> None:
    cfg = RunConfig.from_dict({"steps": 3})
    with pytest.raises(FrozenInstanceError):
        cfg.steps = 4  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        cfg.train.lr = 1.0  # type: ignore[misc]
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # the stored form rebuilds the object
