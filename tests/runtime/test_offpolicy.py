"""Imported rollouts as off-policy RL data (``train.offpolicy_data``): groups handed out a
step at a time, their tokens one version old (never masked, never taken for the current
weights' own), trained with their recorded log-probs; a log without log-probs, or without a
group to compare within, refused by field; and a real run that trains them beside its own."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gyre_core.config import ConfigError, RunConfig, TrainConfig
from gyre_core.events import ListSink
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.models.tokenizer import as_hf_tokenizer, default_corpus, train_tokenizer
from gyre_core.rollout.chat import ChatFormat
from gyre_core.runtime.offpolicy import OffPolicyData, OffPolicyError
from gyre_core.train.losses import fresh_mask
from gyre_core.train.trainer import Trainer, TrainerOptions
from gyre_core.trajectory.format import read_rollouts
from gyre_core.trajectory.synth import PRESETS, synth_rollouts

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def tok() -> Any:
    return as_hf_tokenizer(train_tokenizer(default_corpus(), 600))


def chat_log(fmt: ChatFormat, rows: list[tuple[str, str, float, bool]], path: Path) -> Path:
    """One conversation a row: (id, group, reward, with log-probs)."""
    lines = []
    for rid, group, reward, exact in rows:
        answer: dict[str, Any] = {"role": "assistant", "content": f"Answer {rid}."}
        if exact:
            ids = fmt.codec.encode(f"Answer {rid}.<|im_end|>")
            answer |= {"token_ids": ids, "logprobs": [-0.7] * len(ids)}
        lines.append({"id": rid, "group": group, "reward": reward, "messages": [
            {"role": "user", "content": "Say something."}, answer]})  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_groups_are_handed_out_a_step_at_a_time_one_version_old(tok, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fmt = ChatFormat(tok)
    log = chat_log(fmt, [("a1", "A", 1.0, True), ("a2", "A", 0.0, True), ("b1", "B", 1.0, True),
                         ("b2", "B", 0.5, True), ("c1", "C", 1.0, True)], tmp_path / "l.jsonl")  # fmt: skip
    data = OffPolicyData.read(log, tok, per_step=1)
    assert [[r.rollout_id for r in g] for g in data.groups] == [
        ["a1", "a2"],
        ["b1", "b2"],
    ]  # C: alone
    step3, record = data.take(3)
    assert [r.rollout_id for r in record] == [r.rollout_id for r in step3]
    assert all((c.versions == 0).all() for r in record for c in r.calls)  # the file's versions
    assert [r.rollout_id for r in step3] == ["x3.g0.0", "x3.g0.1"]
    assert {r.group_id for r in step3} == {"x3.g0"}
    assert [r.extra["source_id"] for r in step3] == ["b1", "b2"]  # group (3 * 1) % 2
    assert all(r.extra["offpolicy"] for r in step3)
    assert all(
        (c.versions == 2).all() and (c.logprobs == -0.7).all() for r in step3 for c in r.calls
    )
    assert [r.extra["source_id"] for r in data.take(3)[0]] == ["b1", "b2"]  # a step run again: same
    assert [r.extra["source_id"] for r in data.take(4)[0]] == ["a1", "a2"]
    assert data.groups[0][0].calls[0].versions[0] == 0  # the file's rollouts stay as read


def test_a_log_without_logprobs_or_groups_is_refused_by_field(tok, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fmt = ChatFormat(tok)
    text = chat_log(fmt, [("a1", "A", 1.0, True), ("a2", "A", 0.0, False)], tmp_path / "t.jsonl")
    with pytest.raises(OffPolicyError, match=r"train\.offpolicy_data: .*'a2'.*without logprobs"):
        OffPolicyData.read(text, tok, 1)
    alone = chat_log(fmt, [("a1", "A", 1.0, True), ("b1", "B", 0.0, True)], tmp_path / "s.jsonl")
    with pytest.raises(OffPolicyError, match="no group has two rollouts"):
        OffPolicyData.read(alone, tok, 1)
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "messages": [}\n')
    with pytest.raises(OffPolicyError, match=r"train\.offpolicy_data: .*bad\.jsonl:1"):
        OffPolicyData.read(tmp_path / "bad.jsonl", tok, 1)
    with pytest.raises(ConfigError, match=r"train\.offpolicy_data: needs scheduler\.staleness"):
        RunConfig.from_dict({"train": {"offpolicy_data": str(text)},
                             "scheduler": {"staleness_bound": 0}})  # fmt: skip


def test_imported_tokens_train_with_their_recorded_logprobs() -> None:
    """With ``behaviour: trainer`` a token of the current weights has ratio exactly 1; an
    imported one keeps the log-prob its own policy recorded, so its ratio is not 1, and the
    staleness bound never masks it."""
    vocab = 32
    shape = ModelShape(vocab, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                       intermediate=128, max_positions=256)  # fmt: skip
    rollouts = list(
        synth_rollouts(replace(PRESETS["tiny"], vocab_size=vocab, group_size=2, groups=1))
    )
    for r in rollouts:  # a policy of its own: log-probs far from the model's
        r.calls = [replace(c, logprobs=np.full(len(c.completion_ids), -0.05)) for c in r.calls]

    def ratio(batch: list[Any]) -> dict[str, float]:
        model = build_model(tiny_qwen3_config(shape), seed=0)
        trainer = Trainer(model, TrainConfig(behaviour="trainer"), None, staleness_bound=1,
                          seed=0, options=TrainerOptions(), version=5)  # fmt: skip
        samples = trainer.prepare(batch, 5)
        assert all(fresh_mask(s, 5, 1)[1] == 0 for s in samples)  # nothing masked as stale
        return trainer.step(batch, 5)

    own = [replace(r, calls=[replace(c, versions=np.full(len(c.completion_ids), 5)) for c in r.calls])
           for r in rollouts]  # fmt: skip
    imported = OffPolicyData(rollouts, per_step=1).take(5)[0]
    assert ratio(own)["ratio_mean"] == pytest.approx(1.0, abs=1e-9)
    got = ratio(imported)
    assert got["tokens"] > 0 and got["stale_dropped"] == 0
    assert abs(got["ratio_mean"] - 1.0) > 0.1, got


@pytest.mark.slow
def test_a_run_trains_imported_groups_beside_its_own(ray_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real run (Ray, elastic) with a message log of two groups: each step trains its own
    rollouts and one imported group; the step files hold both, the reward curve only its own."""
    from transformers import AutoTokenizer

    from gyre_core.runtime import run_job
    from gyre_core.runtime.session import make_model_dir

    d = yaml.safe_load((ROOT / "configs" / "demo-elastic.yaml").read_text())
    d.update(steps=2, name="offpolicy", cluster={"units": 3})
    d["rollout"].update(tasks_per_step=1, group_size=2, benchmark_tasks=1, max_turns=4)
    d["train"], d["warm_start"] = {}, {"steps": 0}
    model_dir = make_model_dir(RunConfig.from_dict(d), tmp_path / "m")
    fmt = ChatFormat(AutoTokenizer.from_pretrained(str(model_dir)))
    log = chat_log(fmt, [("a1", "A", 1.0, True), ("a2", "A", 0.0, True), ("b1", "B", 0.0, True),
                         ("b2", "B", 1.0, True)], tmp_path / "log.jsonl")  # fmt: skip
    d["model"] = {"checkpoint": str(model_dir)}
    d["train"].update(offpolicy_data=str(log), offpolicy_groups=1)
    sink = ListSink()
    out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path / "w")
    assert out["status"] == "succeeded" and out["steps"] == 2
    steps = [e for e in sink.events if e.kind == "step_finished"]
    assert [s.metrics["offpolicy_rollouts"] for s in steps] == [2.0, 2.0]
    assert [s.metrics["rollouts"] for s in steps] == [2.0, 2.0]
    assert all(s.metrics["stale_dropped"] == 0 for s in steps)  # version 0's step too
    for k, path in enumerate(sorted((tmp_path / "w" / "rollouts").glob("step-*.jsonl"))):
        rs = list(read_rollouts(path))
        imported = [r for r in rs if r.extra.get("offpolicy")]
        assert [r.rollout_id for r in imported] == [f"x{k}.g0.0", f"x{k}.g0.1"]
        assert len(rs) == 4  # two of its own, one imported group of two
