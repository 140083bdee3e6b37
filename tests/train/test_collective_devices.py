"""Every tensor a training collective sends lives where the backend serves it, whatever the
default device: NCCL takes CUDA tensors only, so the step's stats and a joining unit's
state (AdamW keeps ``step`` on the CPU beside CUDA moments) must be placed on purpose.

The CPU suite has one device, so a real 2-process gloo run makes the *default* device
differ from the training device (``with torch.device("meta")``, as the CPU is the default
beside CUDA training on a GPU): a tensor made without a device then lands where gloo cannot
send it, and a spy on the collectives (which still run) records each tensor's device.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gyre_core.train.collectives import adamw_step, broadcast_plan, served_device_types
from gyre_core.train.losses import LossStats
from gyre_core.train.sharded import ShardedTrainer, unit_mesh
from tests.train.test_sharded import _batch
from tests.train.test_trainer import make_trainer, tiny_model
from tests.train.world import alone, join_world, world_port

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")
F32, F64 = torch.float32, torch.float64


def _spy(devices: list[str]) -> None:
    """Record the device of every tensor handed to all_reduce and broadcast (they run)."""
    for name in ("all_reduce", "broadcast"):
        real = getattr(dist, name)

        def spy(tensor: torch.Tensor, *args, _real=real, **kwargs):  # type: ignore[no-untyped-def]
            devices.append(str(tensor.device))
            return _real(tensor, *args, **kwargs)

        setattr(dist, name, spy)


def _process(rank: int, port: int, out: str) -> None:
    """2 units x 1 process: both step once; unit 1 then loses its state (a joining unit
    has no moments) and takes unit 0's, with the meta device as the default."""
    torch.set_num_threads(1)
    join_world(rank, 2, port)
    try:
        sharded = ShardedTrainer(make_trainer(tiny_model()), unit_mesh(2, 1))
        sharded.step(_batch())
        t = sharded.trainer
        if rank == 1:
            t.optimizer.state.clear()
            with torch.no_grad():
                for _, p in t.params:
                    p.to_local().mul_(0.5)
        devices: list[str] = []
        _spy(devices)
        with torch.device("meta"):
            total = sharded._all_sum(LossStats(objective=rank + 1.0, samples=1.0))
            sharded.broadcast_from(0)
        params = {n: p.to_local().detach().clone() for n, p in t.params}
        optim = {
            n: {k: (v.to_local() if hasattr(v, "to_local") else v).clone() for k, v in st.items()}
            for n, p in t.params
            for st in [t.optimizer.state[p]]
        }
        torch.save(
            {"params": params, "optim": optim, "devices": devices, "total": total},
            f"{out}-{rank}.pt",
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_stats_and_a_joining_units_state_travel_on_the_training_device(tmp_path: Path) -> None:
    out = str(tmp_path / "rank")
    with world_port() as port:
        mp.spawn(_process, args=(port, out), nprocs=2, join=True)
    got = [torch.load(f"{out}-{r}.pt", weights_only=False) for r in (0, 1)]
    for g in got:
        assert g["devices"] and set(g["devices"]) == {"cpu"}, g["devices"]
        assert g["total"].objective == 3.0 and g["total"].samples == 2.0
    source, joined = got
    for n, p in source["params"].items():
        assert torch.equal(joined["params"][n], p), n
    for n, moments in source["optim"].items():
        assert sorted(joined["optim"][n]) == sorted(moments) == ["exp_avg", "exp_avg_sq", "step"]
        for k, v in moments.items():
            mine = joined["optim"][n][k]
            assert (mine.device, mine.dtype) == (v.device, v.dtype) and torch.equal(mine, v)
    assert float(source["optim"]["model.norm.weight"]["step"]) == 1.0


def test_state_is_planned_in_device_and_dtype_groups() -> None:
    tensors = [(CUDA, F32), (CPU, F32), (CUDA, F32), (CPU, F64), (CUDA, torch.bfloat16)]
    nccl = broadcast_plan(tensors, {"cuda"}, CUDA)
    got = {(str(g.device), g.dtype): (str(g.via), g.members) for g in nccl}
    assert got == {
        ("cpu", F32): ("cuda:0", [1]),  # NCCL does not serve the CPU: via the GPU
        ("cpu", F64): ("cuda:0", [3]),
        ("cuda:0", F32): ("cuda:0", [0, 2]),
        ("cuda:0", torch.bfloat16): ("cuda:0", [4]),
    }
    reversed_order = broadcast_plan(tensors[::-1], {"cuda"}, CUDA)  # groups in a fixed order
    assert [(g.device, g.dtype) for g in reversed_order] == [(g.device, g.dtype) for g in nccl]
    gloo = broadcast_plan(tensors, {"cpu", "cuda"}, CPU)
    assert all(g.via == g.device for g in gloo) and len(gloo) == 4
    with pytest.raises(ValueError, match="not the training device cpu"):
        broadcast_plan(tensors, {"cuda"}, CPU)


def test_the_backends_name_their_devices() -> None:
    alone("cpu:gloo")
    try:
        assert served_device_types() == {"cpu"}
    finally:
        dist.destroy_process_group()
    assert set(dist.Backend.backend_capability["nccl"]) == {"cuda"}


@pytest.mark.parametrize("default", [F32, F64])
@pytest.mark.parametrize("fused", [False, True])
def test_a_fresh_step_count_is_what_adamw_makes(default: torch.dtype, fused: bool) -> None:
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.AdamW([p], fused=fused)
        p.grad = torch.ones(3)
        opt.step()
        theirs, mine = opt.state[p]["step"], adamw_step(p, opt.param_groups[0])
    finally:
        torch.set_default_dtype(before)
    assert (mine.device, mine.dtype, float(mine)) == (theirs.device, theirs.dtype, 0.0)


def test_a_transfer_is_cut_into_runs_of_bounded_bytes() -> None:
    """A joining unit's state goes in buffers of at most the limit (a tensor larger than it
    alone), in order: no buffer of the whole state is made beside the state itself."""
    from gyre_core.train.collectives import byte_runs

    xs = [torch.zeros(n) for n in (4, 4, 10, 1, 1, 1, 3)]  # float32: 4 bytes each
    runs = byte_runs(xs, limit=32)
    assert [[x.numel() for x in r] for r in runs] == [[4, 4], [10], [1, 1, 1, 3]]
    assert [x for r in runs for x in r] == xs
