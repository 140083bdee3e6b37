"""``rollout.benchmark_every``: a version is scored on a copy of its own weights."""

import asyncio

import torch

from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.runtime.midrun_bench import BenchmarkEvery, serve_local


def test_a_scoring_sees_its_versions_weights_while_training_moves_on(tmp_path):
    from transformers import AutoModelForCausalLM

    shape = ModelShape(300, layers=1, hidden=32, heads=1, kv_heads=1, head_dim=32,
                       intermediate=64, max_positions=64)  # fmt: skip
    init_checkpoint(tmp_path, shape, seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    seen: dict[int, float] = {}

    async def score(router, version):
        await asyncio.sleep(0.05)  # the next step changes the weights meanwhile
        engine = router.engine("benchmark")
        seen[version] = float(sum(p.sum() for p in engine._model.parameters()))
        return 0.5

    async def main():
        serve = serve_local(lambda: AutoModelForCausalLM.from_pretrained(str(tmp_path)))
        every = BenchmarkEvery(2, 6, score, lambda line: None, serve)
        sums = {}
        for version in range(1, 7):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            sums[version] = float(sum(p.sum() for p in model.parameters()))
            every.after_step({k: v.clone() for k, v in model.state_dict().items()}, version)
        return sums, await every.finish()

    sums, scores = asyncio.run(main())
    assert scores == {2: 0.5, 4: 0.5}  # 6 is the run's last version: its own final benchmark
    assert seen == {2: sums[2], 4: sums[4]}
