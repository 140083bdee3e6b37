"""A step's weights that do not reach an engine fail loudly: the loop's publish over real
Ray actors (one takes the weights, one refuses them, one is killed), and a vLLM client
whose server reports another version than the one it was sent. And what the object-store
route puts in Ray's store: the served dtype, a tied weight once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.rollout.router import Router
from gyre_core.rollout.vllm_engine import VLLMEngine, VLLMEngineError
from gyre_core.runtime.loop import Loop, PublishError, UnitSlot
from gyre_core.runtime.plan import RunPlan
from gyre_core.runtime.ray_backend import UnitEngine
from gyre_core.runtime.train_group import TrainGroup
from gyre_core.scheduler.policies import policy_for
from gyre_core.train.weight_out import gather_buckets
from tests.runtime.conftest import tiny_job
from tests.runtime.update_server import UpdateServer


@ray.remote(num_cpus=0)
class Unit:
    """A unit actor's publish: takes the weights, or refuses them as an engine would."""

    def __init__(self, refuse: bool) -> None:
        self.refuse, self.versions = refuse, []

    async def publish(self, state: Any, version: int) -> None:
        if self.refuse:
            raise RuntimeError("POST /update_weights -> HTTP 500: the update failed")
        self.versions.append(version)

    async def served(self) -> list[int]:
        return list(self.versions)


def loop_over(
    tmp_path: Path, actors: list[Any], job: dict[str, Any] | None = None, trainers: list[Any] = ()
) -> Loop:
    """A run's loop over the rollout units ``actors`` (and a training unit of the
    processes ``trainers`` when given), of ``job`` (tiny_job's by default), after a step
    trained version 3."""
    cfg = RunConfig.from_dict(job or tiny_job())
    units = [UnitSlot(i, a, "rollout", "rollout") for i, a in enumerate(actors)]
    router = Router({})
    for s in units:
        router.add(s.name, UnitEngine(s.actor, 0))
    trainer = TrainGroup(cfg, tmp_path)
    if trainers:
        trainer.members = [UnitSlot(9, trainers[0], "train", "train", procs=list(trainers))]
    trainer.version = 3
    return Loop(
        RunPlan.of(cfg),
        policy=policy_for(cfg.scheduler, len(units)),
        units=units,
        router=router,
        trainer=trainer,
        sink=ListSink(),
        clock=time.monotonic,
        start_session=lambda i: None,
        on_step=lambda *a: None,  # type: ignore[arg-type, return-value]
    )


def test_a_refused_publish_fails_the_step_and_no_version_is_recorded(
    ray_cluster: None, tmp_path: Path
) -> None:
    good, bad = Unit.remote(False), Unit.remote(True)
    loop = loop_over(tmp_path, [good, bad])
    before = loop.published
    with pytest.raises(PublishError, match=r"unit-1.*the update failed"):
        asyncio.run(loop._publish())
    assert loop.published == before  # the engines are not counted as serving version 3
    engine = loop.router.engine("unit-1")
    assert isinstance(engine, UnitEngine) and engine.version == 0
    assert ray.get(good.served.remote()) == [3]


def test_a_unit_that_died_leaves_the_pool_and_the_others_are_published(
    ray_cluster: None, tmp_path: Path
) -> None:
    good, lost = Unit.remote(False), Unit.remote(False)
    ray.kill(lost)
    loop = loop_over(tmp_path, [good, lost])
    asyncio.run(loop._publish())
    assert loop.published == 3
    assert loop.units[1].dead and "unit-1" not in loop.router.live()
    engine = loop.router.engine("unit-0")
    assert isinstance(engine, UnitEngine) and engine.version == 3


def test_an_engine_reporting_another_version_after_an_update_is_an_error() -> None:
    server = UpdateServer(serves="1")  # its weights stay at version 1
    try:
        engine = VLLMEngine(server.url, version=1)

        async def load() -> None:
            pass

        with pytest.raises(VLLMEngineError, match="serves weight version '1' after an update to 2"):
            asyncio.run(engine.update_weights(load, 2))
        assert engine.version == 1  # later tokens keep the version the server holds
    finally:
        server.close()


def test_the_object_store_route_carries_the_served_dtype_and_a_tied_weight_once(
    ray_cluster: None,
) -> None:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, intermediate_size=128, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    state = model.state_dict()
    refs = gather_buckets(model, True, 40_000, "bfloat16", drop_tied=True)
    assert refs is not None and len(refs) > 1
    got = {k: v for chunk in ray.get(refs) for k, v in chunk.items()}
    assert list(got) == [k for k in state if k != "lm_head.weight"]
    assert all(v.dtype == torch.bfloat16 and v.device.type == "cpu" for v in got.values())
    assert all(torch.equal(v, state[k].to(torch.bfloat16)) for k, v in got.items())
    whole = gather_buckets(model, True, 40_000, "float32", drop_tied=False)  # torch engines
    assert whole is not None
    assert list(k for chunk in ray.get(whole) for k in chunk) == list(state)
    assert gather_buckets(model, False, 40_000, "bfloat16", drop_tied=True) is None
