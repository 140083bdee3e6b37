"""The trainer: its config and options, learning signal, dp_width invariance, KL, SFT warm
start and weight export to a TorchEngine. Helpers here are shared by test_trainer_*.py."""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gyre_core.config import ConfigError, RunConfig, TrainConfig
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.plan import train_setup
from gyre_core.train import sparse_attention
from gyre_core.train.trainer import Trainer, TrainerOptions, shard_by_tokens
from gyre_core.trajectory.format import Call, Rollout
from gyre_core.trajectory.synth import PRESETS, synth_rollouts

VOCAB = 32
CONFIG = tiny_qwen3_config(ModelShape(
    VOCAB, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128,
    max_positions=256,
))  # fmt: skip
SYNTH = replace(PRESETS["tiny"], vocab_size=VOCAB, group_size=2)  # ~330 unique tokens


def tiny_model(dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    return build_model(CONFIG, dtype=dtype, seed=seed)


def make_trainer(
    model: Any,
    train: TrainConfig | None = None,
    ref: Any = None,
    *,
    version: int = 0,
    staleness_bound: int = 4,
    **options: Any,
) -> Trainer:
    """A trainer of the ``train`` section (TrainConfig's defaults unless given), seed 0,
    staleness bound 4 unless given, and ``TrainerOptions(**options)``."""
    return Trainer(model, train or TrainConfig(), ref, staleness_bound=staleness_bound, seed=0,
                   options=TrainerOptions(**options), version=version)  # fmt: skip


def count_low(tokens: list[int]) -> float:
    """The toy reward: the share of completion tokens in the rewarded set (ids < 8)."""
    return sum(t < 8 for t in tokens) / len(tokens)


def sample_rollouts(
    model: Any,
    *,
    groups: int = 2,
    group_size: int = 4,
    length: int = 5,
    version: int = 0,
    seed: int = 0,
    tag: str = "g",
    reward: Callable[[list[int]], float] = count_low,
) -> list[Rollout]:
    """GRPO groups sampled from ``model`` itself (temperature 1), with the true behaviour
    log-probs; each group's prompt is ``[1, 2, 3, group]``."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [[1, 2, 3, g] for g in range(groups) for _ in range(group_size)]
    ids = torch.tensor(prompts)
    lps = []
    with torch.no_grad():  # all rollouts at once: the prompts have one length
        for _ in range(length):
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]
            logp = torch.log_softmax(logits.double(), -1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen)
            ids = torch.cat([ids, tok], 1)
            lps.append(logp.gather(1, tok))
    comps, behaviour = ids[:, 4:].numpy(), torch.cat(lps, 1).numpy()
    out = []
    for i, prompt in enumerate(prompts):
        g, r = divmod(i, group_size)
        comp = [int(t) for t in comps[i]]
        call = Call(
            "c0",
            np.asarray(prompt, dtype=np.int64),
            comps[i].astype(np.int64),
            behaviour[i].astype(np.float64),
            np.full(length, version, dtype=np.int64),
        )
        rid = f"{tag}{g}-{r}"
        out.append(Rollout(rid, f"task-{g}", "completed", reward(comp), [call], f"{tag}{g}"))
    return out


def low_mass(model: Any) -> float:
    """Probability of a rewarded token as the first completion token, over the groups."""
    with torch.no_grad():
        probs = [
            torch.softmax(model(input_ids=torch.tensor([[1, 2, 3, g]])).logits[0, -1], -1)
            for g in range(4)
        ]
    return float(sum(p[:8].sum() for p in probs)) / 4


def params(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("max_grad_norm", -1.0),
        ("clip_low", 1.5),
        ("clip_high", -0.1),
        ("kl_coef", -1.0),
        ("advantage_mode", "sometimes"),
        ("max_tokens", 1),
        ("behaviour", "engine"),
    ],
)
def test_bad_train_values_are_refused_by_the_config_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"train": {field: value}})
    assert [path for path, _ in err.value.errors] == [f"train.{field}"]


def test_the_advantage_modes_are_the_configs_choices() -> None:
    with pytest.raises(ConfigError, match=r"train.advantage_mode: must be one of once, per_path"):
        RunConfig.from_dict({"train": {"advantage_mode": "sometimes"}})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("weight_decay", -0.1),
        ("betas", (0.9, 1.0)),
        ("eps", 0.0),
        ("attention", "flash"),
    ],
)
def test_bad_option_values_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^TrainerOptions\.{field} must be .*, got"):
        TrainerOptions(**{field: value})


def test_an_unknown_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown loss 'nope'; expected one of ppo"):
        make_trainer(tiny_model(), TrainConfig(loss="nope"))


def test_ratio_cap_must_exceed_the_clip() -> None:
    with pytest.raises(ValueError, match=r"ratio_cap must be > 1 \+ train.clip_high \(1.28\)"):
        make_trainer(tiny_model(), TrainConfig(ratio_cap=1.1))


def test_kl_needs_a_reference_model() -> None:
    with pytest.raises(ValueError, match="kl_coef > 0 needs a ref_model"):
        make_trainer(tiny_model(), TrainConfig(kl_coef=0.1))


def test_attention_path_must_match_the_model() -> None:
    with pytest.raises(ValueError, match=r"attention='sparse' needs a model built with .*'sdpa'"):
        make_trainer(tiny_model(), attention="sparse")


def test_sparse_attention_path_gives_the_dense_gradients(
    float64_exact: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sparse_attention, "BLOCK", 16)  # several blocks per sample
    dense = make_trainer(tiny_model(torch.float64), TrainConfig(max_tokens=100), version=2)
    sparse_model = build_model(CONFIG, dtype=torch.float64, attn_implementation="gyre_tree")
    sparse = make_trainer(sparse_model, TrainConfig(max_tokens=100), version=2, attention="sparse")
    samples = dense.prepare(synth_rollouts(replace(SYNTH, groups=1)), 2)
    want, ws = dense.compute_grads(samples)
    got, gs = sparse.compute_grads(samples)
    assert gs.tokens == ws.tokens > 0 and gs.entropy == pytest.approx(ws.entropy, rel=1e-9)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-12)


def test_the_runs_trainer_takes_its_sections_values() -> None:
    cfg = RunConfig.from_dict({"seed": 3, "scheduler": {"staleness_bound": 1},
                               "train": {"lr": 1e-3, "advantage_mode": "per_path"}})  # fmt: skip
    trainer = Trainer.for_run(tiny_model(), train_setup(cfg))
    assert trainer.config is cfg.train and trainer.staleness_bound == 1 and trainer.seed == 3
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-3
    assert trainer.config.weighting.mode == "per_path"
    settings = trainer.settings()
    assert settings["lr"] == 1e-3 and settings["betas"] == [0.9, 0.999]
    assert settings["staleness_bound"] == 1 and settings["loss"] == "ppo"


# --------------------------------------------------------------------------- steps


@pytest.mark.slow
def test_a_few_steps_raise_the_rewarded_tokens_probability() -> None:
    model = tiny_model(torch.float32, seed=1)
    trainer = make_trainer(model, TrainConfig(lr=1e-2, max_tokens=256))
    before = low_mass(model)
    for step in range(4):
        rollouts = sample_rollouts(model, groups=4, group_size=8, version=trainer.version,
                                   seed=step)  # fmt: skip
        metrics = trainer.step(rollouts)
        assert metrics["skipped"] == 0.0 and metrics["version"] == step + 1
        assert (
            metrics["stale_dropped"] == 0 and 0 < metrics["tokens"] <= 4 * 8 * 5
        )  # shared ones once
        assert 0.0 <= metrics["clip_fraction"] <= 1.0 and metrics["entropy"] > 0
    after = low_mass(model)
    assert trainer.version == 4
    assert after > before + 0.25, (before, after)  # measured: 0.25 -> 0.75


@pytest.mark.slow
@pytest.mark.parametrize("average", ["token", "execution_then_batch"])
def test_dp_width_does_not_change_the_step(average: str, float64_exact: None) -> None:
    rollouts = list(synth_rollouts(SYNTH))
    cfg = TrainConfig(lr=1e-3, max_tokens=100, clip_high=0.28, ratio_cap=4.0, average=average)
    runs = {}
    for width in (1, 3):
        trainer = make_trainer(tiny_model(torch.float64), cfg, version=2)
        samples = trainer.prepare(rollouts, 2)
        assert len(samples) >= 4  # enough to fill 3 shards unevenly
        metrics = [trainer.step(rollouts, dp_width=width) for _ in range(2)]
        runs[width] = (params(trainer.model), metrics)
    p1, m1 = runs[1]
    p3, m3 = runs[3]
    for k in p1:
        torch.testing.assert_close(p3[k], p1[k], rtol=1e-9, atol=1e-12)
    for a, b in zip(m1, m3, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12), k


def _one_step(
    rollouts: list[Rollout], cfg: TrainConfig, version: int = 0
) -> dict[str, torch.Tensor]:
    trainer = make_trainer(tiny_model(), cfg, version=version)
    trainer.step(rollouts)
    return params(trainer.model)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_step_does_not_depend_on_the_order_its_rollouts_arrive_in() -> None:
    # Rollouts reach the trainer in the order they finish, which is timing. The same set
    # must give the same weights bit for bit (measured without the sort: 5e-6 apart).
    rollouts = sample_rollouts(tiny_model(), groups=3, group_size=4, length=6)
    cfg = TrainConfig(lr=1e-2, max_tokens=40)
    first = _one_step(rollouts, cfg)
    for seed in range(3):
        shuffled = rollouts[:]
        random.Random(seed).shuffle(shuffled)
        assert _max_diff(_one_step(shuffled, cfg), first) == 0.0


def _jitter(rollouts: list[Rollout], scale: float) -> list[Rollout]:
    """The rollouts with every recorded log-prob moved by noise of size ``scale``: what
    an engine's batch composition does to them (measured: up to 5e-7)."""
    out = copy.deepcopy(rollouts)
    rng = np.random.default_rng(0)
    for r in out:
        for c in r.calls:
            c.logprobs[:] = c.logprobs + rng.normal(0.0, scale, len(c.logprobs))
    return out


@pytest.mark.parametrize("version", [0, 1])
def test_trainer_behaviour_ignores_engine_numerics_for_current_tokens_only(version: int) -> None:
    # Tokens of version 0; the trainer at `version`. Current tokens (version 0) under
    # behaviour="trainer" take the trainer's own log-prob, so jitter in what the engine
    # recorded cannot move the step. Stale tokens (trainer at 1) keep the recorded
    # log-probs, jitter and all, as does behaviour="recorded".
    rollouts = sample_rollouts(tiny_model(), groups=2, group_size=4, length=6)
    jittered = _jitter(rollouts, 5e-7)
    for behaviour in ("recorded", "trainer"):
        cfg = TrainConfig(lr=1e-2, max_tokens=64, behaviour=behaviour)
        diff = _max_diff(_one_step(rollouts, cfg, version), _one_step(jittered, cfg, version))
        if behaviour == "trainer" and version == 0:
            assert diff == 0.0
        else:
            assert diff > 1e-7, (behaviour, version, diff)


def test_shards_are_balanced_and_cover_every_sample_once() -> None:
    trainer = make_trainer(tiny_model(), TrainConfig(max_tokens=100))
    samples = trainer.prepare(synth_rollouts(SYNTH), 2)
    shards = shard_by_tokens(samples, 3)
    assert sorted(id(s) for sh in shards for s in sh) == sorted(id(s) for s in samples)
    loads = [sum(len(s) for s in sh) for sh in shards]
    assert max(loads) - min(loads) <= max(len(s) for s in samples)
    assert shard_by_tokens(samples[:1], 3)[1:] == [[], []]


def test_apply_refuses_mismatched_replica_gradients() -> None:
    trainer = make_trainer(tiny_model())
    good = {n: torch.zeros_like(p) for n, p in trainer.params}
    with pytest.raises(ValueError, match="at least one replica"):
        trainer.apply([])
    name = trainer.params[0][0]
    with pytest.raises(ValueError, match=rf"replica 1's gradients lack parameter '{name}'"):
        trainer.apply([good, {k: v for k, v in good.items() if k != name}])
    with pytest.raises(ValueError, match=rf"replica 0's gradient for '{name}' has shape \(1,\)"):
        trainer.apply([{**good, name: torch.zeros(1)}])
    assert trainer.version == 0


def test_all_stale_batch_is_skipped_without_touching_the_weights() -> None:
    model = tiny_model()
    trainer = make_trainer(model, version=5, staleness_bound=1)
    before = params(model)
    metrics = trainer.step(sample_rollouts(model, groups=1, version=2))
    assert metrics["skipped"] == 1.0 and metrics["stale_dropped"] == 4 * 5
    assert trainer.version == 5
    assert all(torch.equal(before[k], v) for k, v in params(model).items())


@pytest.mark.slow
def test_kl_to_the_reference_grows_once_the_policy_moves() -> None:
    model = tiny_model(torch.float64)
    ref = copy.deepcopy(model)
    trainer = make_trainer(model, TrainConfig(lr=1e-2, kl_coef=0.5, max_tokens=256), ref)
    first = trainer.step(sample_rollouts(model, groups=2, group_size=4))
    assert first["kl"] == pytest.approx(0.0, abs=1e-12)  # policy == reference
    second = trainer.step(sample_rollouts(model, groups=2, group_size=4, version=1, seed=1))
    assert second["kl"] > 1e-6
    assert not any(p.requires_grad for p in ref.parameters())


def test_sft_warm_start_learns_the_demonstration() -> None:
    model = tiny_model(torch.float64)
    trainer = make_trainer(model, TrainConfig(lr=1e-2))
    prompt, target = [1, 2, 3], [7, 8, 9]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + target])).logits[0]
    naive = -torch.log_softmax(logits[2:5], -1).gather(1, torch.tensor([[7], [8], [9]])).mean()
    first = trainer.sft_step([(prompt, target)])
    assert first["sft_loss"] == pytest.approx(float(naive), rel=1e-9)
    assert first["tokens"] == 3 and trainer.version == 1
    for _ in range(5):
        last = trainer.sft_step([(prompt, target)])
    assert last["sft_loss"] < 0.5 * first["sft_loss"]
    with pytest.raises(ValueError, match="non-empty prompt"):
        trainer.sft_step([([], [4])])


def test_exported_weights_change_a_published_engine(tmp_path: Path) -> None:
    model = tiny_model()
    trainer = make_trainer(model, TrainConfig(lr=5e-2, max_tokens=256))
    engine = TorchEngine(tiny_model(), version=0)  # same initial weights as the trainer's
    greedy = SamplingParams(max_tokens=6, temperature=0.0)

    async def gen(e: TorchEngine, rid: str) -> tuple[list[int], list[float], list[int]]:
        c = await e.generate([1, 2, 3, 0], greedy, request_id=rid)
        return c.token_ids, c.logprobs, c.versions

    before = asyncio.run(gen(engine, "a"))
    trainer.step(sample_rollouts(model, groups=2, group_size=8))
    path = trainer.export_weights(tmp_path / "w")
    assert path.name == "model.safetensors" and not list((tmp_path / "w").glob(".*"))

    async def publish_then_gen() -> tuple[list[int], list[float], list[int]]:
        await engine.publish(str(path), trainer.version)
        return await gen(engine, "b")

    after = asyncio.run(publish_then_gen())
    assert engine.version == 1 and after[2] == [1] * 6
    assert after[1] != pytest.approx(before[1], abs=1e-3)
    want = asyncio.run(gen(TorchEngine(copy.deepcopy(model), version=1), "c"))
    assert after[0] == want[0]
    assert after[1] == pytest.approx(want[1], abs=1e-5)
