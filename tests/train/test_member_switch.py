"""A switch rebuilds only what changes: 2 units x 2 processes (gloo), real processes.

The run goes 2 units -> 1 (unit 1 leaves) -> 2 (unit 1 joins again), a step at each width.
The processes that stay keep their shards, the very tensors (the same storage before and
after each switch: nothing copied, nothing read from the model folder); the joining unit
builds its model on the meta device and receives its shards from unit 0. The final
weights equal the plain single-process trainer's after the same steps, within 1e-5."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from gyre_core.config import RunConfig
from gyre_core.runtime.plan import train_setup
from gyre_core.train.member import INIT
from gyre_core.train.trainer import Trainer
from tests.train.members import Place, free_port, member_for, step
from tests.train.test_trainer import sample_rollouts, tiny_model

pytestmark = pytest.mark.slow
WIDTHS = [[0, 1], [0], [0, 1]]


def _batch(version: int) -> list:  # type: ignore[type-arg]
    return sample_rollouts(tiny_model(seed=1), groups=3, group_size=4, length=6, seed=version,
                           version=version)  # fmt: skip


def _storage(member) -> dict[str, int]:  # type: ignore[no-untyped-def]
    t = member.sharded.trainer
    ptrs = {n: p.to_local().untyped_storage().data_ptr() for n, p in t.params}
    for n, p in t.params:
        for k, v in t.optimizer.state.get(p, {}).items():
            if v.dim():
                ptrs[f"{n}:{k}"] = v.to_local().untyped_storage().data_ptr()
    return ptrs


def _process(index: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    place = Place(index, 2, port)
    place.open_store()
    member, plan, bound = member_for(model_dir)
    moved: dict[int, list[str]] = {}
    for n, units in enumerate(WIDTHS):
        before = _storage(member) if member.formed and place.spec(units, n) else {}
        spec = place.spec(units, n, INIT if n == 0 else "keep", replica=0 if n == 2 else -1)
        if spec is None:
            member.leave()
            continue
        place.form(member, spec)
        after = _storage(member)
        moved[n] = sorted(k for k in before if before[k] != after[k])
        step(member, plan, bound, _batch(n), n, spec.rank, len(units) * 2)
    full = member.gather()
    if full is not None:
        torch.save({"params": full, "moved": moved}, out)
    member.leave()


def test_a_switch_keeps_the_shards_themselves_and_the_run_is_the_same(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    out = tmp_path / "out.pt"
    mp.spawn(_process, args=(free_port(), str(model_dir), str(out)), nprocs=4, join=True)
    got = torch.load(out)
    assert got["moved"][1] == [] and got["moved"][2] == [], f"copied: {got['moved']}"
    cfg = RunConfig.from_dict({"model": {"checkpoint": str(model_dir)}})
    plain = Trainer.for_run(tiny_model(), train_setup(cfg))
    for v in range(len(WIDTHS)):
        plain.step(_batch(v))
    for n, p in plain.model.named_parameters():
        want = p.detach()
        diff = float((got["params"][n] - want).norm() / want.norm().clamp_min(1e-12))
        assert diff < 1e-5, f"{n} differs by {diff:.2e} relative"
    shutil.rmtree(model_dir)
