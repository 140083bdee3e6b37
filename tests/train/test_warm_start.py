"""The learning demo's pieces around the trainer: the suite tokenizer, the warm start on
fresh scripted demonstrations, and the config fields that turn them on."""

from __future__ import annotations

import asyncio

import pytest
import torch

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import ListSink, PhaseProgress
from gyre_core.runtime.benchmark import benchmark, run_benchmark
from gyre_core.runtime.session import SessionFactory, make_model_dir, tokenizer_corpus
from gyre_core.runtime.warm_start import WarmStart

LEARN = {
    "model": {"tokenizer": "suite", "hidden_size": 64, "layers": 1},
    "rollout": {"hints": "status", "benchmark_split": "heldout", "tasks_per_step": 1,
                "group_size": 2, "benchmark_tasks": 2, "max_turns": 6, "context_budget": 2048},
    "train": {"lr": 1e-3},
    "warm_start": {"steps": 4, "demos": 2, "lr": 1e-2},
}  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_model_dir(RunConfig.from_dict(LEARN), tmp_path_factory.mktemp("learn"))


def test_suite_tokenizer_makes_suite_words_single_tokens(model_dir) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    # words as actions spell them (a name with the "/" before it and an extension with its
    # ".", as Qwen's pre-tokenizer cuts a path; keys and values after a space), from both
    # vocabularies
    for word in ("/payments", ".json", " sqlite", " retries", "write", "/ledger", " endpoint",
                 " zstd", " payments"):  # fmt: skip
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
    assert tokenizer_corpus(RunConfig()) is None  # the generic default stays the default
    corpus = tokenizer_corpus(RunConfig.from_dict(LEARN))
    assert corpus is not None and any("focus: " in t for t in corpus)


def test_warm_start_trains_on_fresh_demos_and_restores_the_rl_lr(model_dir) -> None:  # type: ignore[no-untyped-def]
    cfg = RunConfig.from_dict({**LEARN, "model": {"checkpoint": str(model_dir)}})
    factory = SessionFactory(cfg, model_dir, ListSink(), lambda: 0.0)
    trainer = factory.make_trainer()
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    warm = WarmStart(factory)
    losses = asyncio.run(warm.run(trainer))
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert trainer.version == 0  # the warm-started weights are version 0 of the RL run
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [1e-3]
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert warm.warm_start_losses == losses


def test_learning_fields_are_validated() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"rollout": {"hints": "on", "benchmark_split": "test"},
                             "model": {"tokenizer": "bpe"},
                             "warm_start": {"demos": -1, "lr": -1.0}})  # fmt: skip
    paths = {p for p, _ in err.value.errors}
    assert paths == {"rollout.hints", "rollout.benchmark_split", "model.tokenizer",
                     "warm_start.demos", "warm_start.lr"}  # fmt: skip
    d = RunConfig().to_dict()
    assert (d["rollout"]["hints"], d["rollout"]["benchmark_split"]) == ("off", "benchmark")
    assert (d["model"]["tokenizer"], d["warm_start"]["demos"]) == ("generic", 0)


def test_session_reward_follows_the_configured_kind(model_dir) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    from gyre_core.rollout.router import Router
    from gyre_core.rollout.torch_engine import TorchEngine

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    rewards = {}
    for kind in ("progress", "partial", "binary"):
        d = {**LEARN, "model": {"checkpoint": str(model_dir)}}
        d["rollout"] = {**LEARN["rollout"], "reward": kind, "max_turns": 3}  # type: ignore[dict-item]
        factory = SessionFactory(RunConfig.from_dict(d), model_dir, ListSink(), lambda: 0.0)

        async def one(f: SessionFactory = factory) -> object:
            return await f.session(0, Router({"e": TorchEngine(model)}), None)  # type: ignore[arg-type]

        r = asyncio.run(one())
        rewards[kind] = (r.reward, r.progress)  # type: ignore[attr-defined]
    assert rewards["progress"][0] == rewards["progress"][1]
    assert 0.0 <= rewards["partial"][0] <= 1.0 and rewards["binary"][0] in (0.0, 1.0)
    assert rewards["binary"][0] == float(rewards["binary"][1] >= 1.0)


def test_sample_seed_redraws_the_rollout_on_the_same_task(model_dir) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    from gyre_core.rollout.router import Router
    from gyre_core.rollout.torch_engine import TorchEngine

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)

    def draw(sample_seed: int) -> tuple[list[int], list[list[int]]]:
        d = {**LEARN, "model": {"checkpoint": str(model_dir)}}
        d["rollout"] = {**LEARN["rollout"], "max_turns": 3, "sample_seed": sample_seed}  # type: ignore[dict-item]
        factory = SessionFactory(RunConfig.from_dict(d), model_dir, ListSink(), lambda: 0.0)

        async def one() -> object:
            return await factory.session(0, Router({"e": TorchEngine(model)}), None)  # type: ignore[arg-type]

        calls = asyncio.run(one()).calls  # type: ignore[attr-defined]
        return list(calls[0].prompt_ids), [list(c.completion_ids) for c in calls]

    first, again, other = draw(0), draw(0), draw(1)
    assert first == again  # the default draw is the one `seed` always gave
    assert other[0] == first[0]  # the same task: the same first observation
    assert other[1] != first[1]  # sampled otherwise
    with pytest.raises(ConfigError, match="sample_seed"):
        RunConfig.from_dict({"rollout": {"sample_seed": -1}})


def test_a_sampled_benchmark_scores_k_seeded_draws_a_task(model_dir) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    from gyre_core.rollout.router import Router
    from gyre_core.rollout.torch_engine import TorchEngine

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    d = {**LEARN, "model": {"checkpoint": str(model_dir)}}
    d["rollout"] = {**LEARN["rollout"], "max_turns": 3, "temperature": 0.9}  # type: ignore[dict-item]
    sink = ListSink()
    factory = SessionFactory(RunConfig.from_dict(d), model_dir, sink, lambda: 0.0)
    asked: list[tuple[str, float, int | None]] = []

    class Recording(TorchEngine):
        async def generate(self, prompt_ids, params, *, request_id):  # type: ignore[no-untyped-def]
            asked.append((request_id.split("/")[0], params.temperature, params.seed))
            return await super().generate(prompt_ids, params, request_id=request_id)

    def score(samples: int) -> tuple[float, list[tuple[str, float, int | None]]]:
        asked.clear()
        s = asyncio.run(benchmark(factory, Router({"e": Recording(model)}), 3, samples=samples))
        return s, list(asked)

    def per_session(
        cs: list[tuple[str, float, int | None]],
    ) -> dict[str, list[tuple[float, int | None]]]:
        out: dict[str, list[tuple[float, int | None]]] = {}
        for r, t, seed in cs:
            out.setdefault(r, []).append((t, seed))
        return out

    greedy, greedy_calls = score(0)
    assert 0.0 <= greedy <= 1.0
    assert {t for _, t, _ in greedy_calls} == {0.0}
    assert {r for r, _, _ in greedy_calls} == {"bench-v3-0", "bench-v3-1"}  # one per task
    assert not [e for e in sink.events if e.kind == "benchmark"]  # a reading: no event

    sampled, calls = score(3)
    assert {t for _, t, _ in calls} == {0.9}  # the rollouts' temperature
    sessions = {r for r, _, _ in calls}
    assert sessions == {f"bench-v3-{k}-s{j}" for k in range(2) for j in range(3)}
    first_seed = {r: seed for r, _, seed in reversed(calls)}  # each session's first call
    assert len(set(first_seed.values())) == 6  # every draw is seeded apart
    assert 0.0 <= sampled <= 1.0
    again, calls_again = score(3)
    # The same draws every time: each session asks the same calls (sessions interleave freely).
    assert (again, per_session(calls_again)) == (sampled, per_session(calls))
    # The run's own benchmark: rollout.benchmark_samples draws a task, and an event.
    d["rollout"]["benchmark_samples"] = 3  # type: ignore[index]
    own = SessionFactory(RunConfig.from_dict(d), model_dir, sink, lambda: 0.0)
    assert asyncio.run(run_benchmark(own, Router({"e": TorchEngine(model)}), 3)) == sampled
    events = [e for e in sink.events if e.kind == "benchmark"]
    assert [(e.step, e.score, e.tasks, e.samples) for e in events] == [(3, sampled, 2, 3)]
    with pytest.raises(ValueError, match="samples"):
        asyncio.run(benchmark(factory, Router({"e": TorchEngine(model)}), 3, samples=-1))


def test_tied_embeddings_share_one_matrix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    cfg = RunConfig.from_dict({"model": {"tie_embeddings": True, "layers": 1}})
    out = make_model_dir(cfg, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    untied = make_model_dir(RunConfig.from_dict({"model": {"layers": 1}}), tmp_path / "u")
    m2 = AutoModelForCausalLM.from_pretrained(str(untied), dtype=torch.float32)
    assert m2.lm_head.weight.data_ptr() != m2.model.embed_tokens.weight.data_ptr()


def _hasty(model_dir, k: int, skip: float) -> tuple[list[str], float, object]:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from gyre_core.rollout.agents import ScriptedAgent
    from gyre_core.rollout.harness import run_session
    from gyre_core.rollout.task_env import make_env
    from tests.rollout.budgets import session_config

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    env = make_env("repo", "train", 3 * k, seed=k, hints=True)  # short tasks
    agent = ScriptedAgent(env, tok, skip_check=skip, seed=k)
    r = asyncio.run(run_session(env, agent, tok, session_config(max_turns=60), rollout_id=f"h{k}"))
    actions = [tok.decode(c.completion_ids).strip() for c in r.calls]
    return actions, r.progress, env


def test_hasty_demonstrator_writes_everything_and_checks_only_some(model_dir) -> None:  # type: ignore[no-untyped-def]
    from gyre_core.rollout.agents import ScriptedAgent

    checked = total = 0
    for k in range(30):
        actions, progress, env = _hasty(model_dir, k, 0.7)
        spec = env.env.spec  # type: ignore[attr-defined]
        oracle = [a for i in range(len(spec.components)) for a in env.oracle_actions(i)]  # type: ignore[attr-defined]
        # every create and write of the oracle, in the oracle's order; checks are what it skips
        assert [a for a in actions if a.split()[0] in ("create_file", "write")] == [
            a for a in oracle if a.split()[0] in ("create_file", "write")
        ]
        assert env.env.credit >= progress  # type: ignore[attr-defined]
        assert actions[-1] == "submit" or progress == 1.0
        # once every file is written it checks what is left latest first, as the bar names
        order = [c.name for c in spec.components]
        done = max(i for i, a in enumerate(actions) if a.split()[0] in ("create_file", "write"))
        late = [order.index(a.split()[1]) for a in actions[done + 1 :] if a.startswith("run_")]
        late = [x for i, x in enumerate(late) if i == 0 or late[i - 1] != x]  # flaky re-checks
        assert late == sorted(late, reverse=True)
        passed = sum(env.env.hidden_check(c.name) for c in spec.components)  # type: ignore[attr-defined]
        assert progress == passed / len(spec.components)
        checked += passed
        total += len(spec.components)
        assert _hasty(model_dir, k, 0.7)[0] == actions  # seeded: the same demo again
    # with skip 0.7, about 0.3 of components are checked at once and some more at the end
    assert 0.2 < checked / total < 0.7, checked / total
    assert all(_hasty(model_dir, k, 0.0)[1] == 1.0 for k in range(3))  # skip 0 = the oracle
    env = _hasty(model_dir, 0, 0.0)[2]
    with pytest.raises(ValueError, match="skip_check"):
        ScriptedAgent(env, None, skip_check=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"warm_start": {"skip_check": 1.0}})
    assert {p for p, _ in err.value.errors} == {"warm_start.skip_check"}


def test_every_hasty_choice_checks_with_probability_one_minus_q(model_dir) -> None:  # type: ignore[no-untyped-def]
    """Right after the first file and right after the last one, the demonstrator checks
    with the same probability 1 - q: the last component gets no second chance (which
    would make checking it the likelier action, 1 - q**2, and the imitating policy's
    greedy choice)."""
    from transformers import AutoTokenizer

    from gyre_core.rollout.agents import ScriptedAgent
    from gyre_core.rollout.task_env import make_env

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    env = make_env("repo", "train", 0, seed=0, hints=True)
    n = len(env.components())
    first_writes = len([a for a in env.oracle_actions(0) if not a.startswith(("run_", "fix"))])
    at_first = at_last = 0
    seeds = 400
    for seed in range(seeds):
        plan = ScriptedAgent(env, tok, skip_check=0.7, seed=seed)._hasty_plan(n)
        at_first += plan[first_writes].startswith("run_check ")
        last_write = max(i for i, a in enumerate(plan) if a.startswith(("create_file", "write")))
        at_last += last_write + 1 < len(plan) and plan[last_write + 1].startswith("run_check ")
    assert abs(at_first / seeds - 0.3) < 0.07, at_first / seeds
    assert abs(at_last / seeds - 0.3) < 0.07, at_last / seeds


def test_warm_start_cache_reuses_an_identical_warm_start_exactly(model_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gyre_core.runtime import warm_cache

    d = {**LEARN, "model": {"checkpoint": str(model_dir)},
         "warm_start": {**LEARN["warm_start"], "cache": str(tmp_path / "cache")}}  # fmt: skip
    cfg = RunConfig.from_dict(d)

    def warm(c: RunConfig):  # type: ignore[no-untyped-def]
        factory = SessionFactory(c, model_dir, ListSink(), lambda: 0.0)
        trainer = factory.make_trainer()
        ws = WarmStart(factory)
        losses = asyncio.run(ws.run(trainer))
        return ws, trainer, losses

    first, t1, losses1 = warm(cfg)
    assert first.warm_start_cached == "" and len(losses1) == 4
    second, t2, losses2 = warm(cfg)
    assert second.warm_start_cached and losses2 == losses1
    assert second.warm_start_s == first.warm_start_s
    s1, s2 = t1.model.state_dict(), t2.model.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    m1 = t1.optimizer.state_dict()["state"]
    m2 = t2.optimizer.state_dict()["state"]
    assert m1.keys() == m2.keys() and all(
        torch.equal(m1[i]["exp_avg"], m2[i]["exp_avg"]) for i in m1
    )  # the optimizer's moments come back too: RL continues as if it had trained them
    assert t2.version == 0 and [g["lr"] for g in t2.optimizer.param_groups] == [1e-3]
    # anything the warm start depends on changes the key
    other = RunConfig.from_dict({**d, "warm_start": {**d["warm_start"], "steps": 3}})
    assert warm_cache.cache_key(other, model_dir) != warm_cache.cache_key(cfg, model_dir)
    assert warm(other)[0].warm_start_cached == ""
    delegated = RunConfig.from_dict({**d, "rollout": {**d["rollout"], "delegate": True}})
    assert warm_cache.cache_key(delegated, model_dir) != warm_cache.cache_key(cfg, model_dir)
    # the RL rate is not read by a warm start with its own rate: same entry, this run's rate
    faster = RunConfig.from_dict({**d, "train": {**d["train"], "lr": 5e-4}})
    assert warm_cache.cache_key(faster, model_dir) == warm_cache.cache_key(cfg, model_dir)
    # nor RL's policy loss, nor what acts after the warm start
    after = {"train": {**d["train"], "loss": "pg", "ratio_cap": 2.0},
             "warm_start": {**d["warm_start"], "fresh_optimizer": False}}  # fmt: skip
    later = RunConfig.from_dict({**d, **after})
    assert warm_cache.cache_key(later, model_dir) == warm_cache.cache_key(cfg, model_dir)
    third, t3, _ = warm(faster)
    assert third.warm_start_cached and [g["lr"] for g in t3.optimizer.param_groups] == [5e-4]


def test_warm_start_ends_early_at_the_target_loss(model_dir) -> None:  # type: ignore[no-untyped-def]
    def run(until: float) -> list[float]:
        d = {**LEARN, "model": {"checkpoint": str(model_dir)},
             "warm_start": {**LEARN["warm_start"], "steps": 22, "until_loss": until}}  # fmt: skip
        factory = SessionFactory(RunConfig.from_dict(d), model_dir, ListSink(), lambda: 0.0)
        return asyncio.run(WarmStart(factory).run(factory.make_trainer()))

    assert len(run(1e6)) == 20  # the first full window of 20 steps is under any loss
    assert len(run(0.0)) == 22  # 0: every step


def test_anneal_steps_follow_the_target_loss_at_their_own_rate(model_dir) -> None:  # type: ignore[no-untyped-def]
    def run(**warm_start: float) -> tuple[list[float], WarmStart]:
        d = {**LEARN, "model": {"checkpoint": str(model_dir)},
             "warm_start": {**LEARN["warm_start"], "steps": 22, **warm_start}}  # fmt: skip
        factory = SessionFactory(RunConfig.from_dict(d), model_dir, ListSink(), lambda: 0.0)
        trainer = factory.make_trainer()
        warm = WarmStart(factory)
        losses = asyncio.run(warm.run(trainer))
        assert trainer.version == 0 and [g["lr"] for g in trainer.optimizer.param_groups] == [1e-3]
        return losses, warm

    # Stopped at 20 steps by the target loss, then 3 anneal steps: at the warm start's own
    # rate they are exactly the 21st-23rd steps of a longer warm start ...
    same, _ = run(until_loss=1e6, anneal_steps=3, anneal_lr=1e-2)
    longer, _ = run(steps=23)
    assert len(same) == 23 and same == longer
    # ... and at a lower rate they train the same demonstrations differently.
    low, warm = run(until_loss=1e6, anneal_steps=3, anneal_lr=1e-4)
    assert low[:20] == same[:20] and low[20:] != same[20:]
    assert warm.warm_start_losses == low


def test_warm_start_continues_where_an_earlier_one_stopped(model_dir) -> None:  # type: ignore[no-untyped-def]
    d = {**LEARN, "model": {"checkpoint": str(model_dir)}}

    def factory(steps: int) -> SessionFactory:
        c = RunConfig.from_dict({**d, "warm_start": {**LEARN["warm_start"], "steps": steps}})
        return SessionFactory(c, model_dir, ListSink(), lambda: 0.0)

    whole = factory(4)
    t_whole = whole.make_trainer()
    losses = asyncio.run(WarmStart(whole).run(t_whole))
    part = factory(2)
    t_part = part.make_trainer()
    first = asyncio.run(WarmStart(part).run(t_part))
    rest = asyncio.run(WarmStart(factory(4)).run(t_part, first_step=2))
    assert first + rest == losses  # the same demonstrations, in the same order
    a, b = t_whole.model.state_dict(), t_part.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_warm_start_from_a_weights_file(model_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from safetensors.torch import save_file

    d = {**LEARN, "model": {"checkpoint": str(model_dir)}}
    warmed = SessionFactory(RunConfig.from_dict(d), model_dir, ListSink(), lambda: 0.0)
    trainer = warmed.make_trainer()
    losses = asyncio.run(WarmStart(warmed).run(trainer))
    path = tmp_path / "warm.safetensors"
    save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps({"losses": losses, "seconds": 1.5}))

    cfg = RunConfig.from_dict({**d, "warm_start": {**LEARN["warm_start"], "weights": str(path)}})
    factory = SessionFactory(cfg, model_dir, ListSink(), lambda: 0.0)
    fresh = factory.make_trainer()
    warm = WarmStart(factory)
    assert asyncio.run(warm.run(fresh)) == losses  # no step of its own
    a, b = trainer.model.state_dict(), fresh.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert warm.warm_start_cached == str(path) and warm.warm_start_s == 1.5
    assert fresh.version == 0

    missing = RunConfig.from_dict({**d, "warm_start": {"weights": str(tmp_path / "no")}})
    f2 = SessionFactory(missing, model_dir, ListSink(), lambda: 0.0)
    with pytest.raises(ValueError, match="no such file"):
        asyncio.run(WarmStart(f2).run(f2.make_trainer()))
    wider = {**d, "model": {"tokenizer": "suite", "hidden_size": 96, "layers": 1}}
    other_dir = make_model_dir(RunConfig.from_dict(wider), tmp_path / "wide")
    wide = RunConfig.from_dict({**wider, "model": {**wider["model"], "checkpoint": str(other_dir)},
                                "warm_start": {"weights": str(path)}})  # fmt: skip
    f3 = SessionFactory(wide, other_dir, ListSink(), lambda: 0.0)
    with pytest.raises(ValueError, match="does not fit this run's model"):
        asyncio.run(WarmStart(f3).run(f3.make_trainer()))


def test_advantage_settings_reach_the_trainer(model_dir) -> None:  # type: ignore[no-untyped-def]
    d = {**LEARN, "model": {"checkpoint": str(model_dir)},
         "train": {"advantage_mode": "per_path", "normalise_std": True}}  # fmt: skip
    factory = SessionFactory(RunConfig.from_dict(d), model_dir, ListSink(), lambda: 0.0)
    weighting = factory.make_trainer().config.weighting
    assert (weighting.mode, weighting.normalise_std) == ("per_path", True)
    assert RunConfig().train.advantage_mode == "once"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"train": {"advantage_mode": "sum"}})
    assert {p for p, _ in err.value.errors} == {"train.advantage_mode"}


def test_kv_heads_shape_the_tiny_model(tmp_path) -> None:
    import json

    d = {"model": {"hidden_size": 64, "layers": 1, "kv_heads": 2}}
    out = make_model_dir(RunConfig.from_dict(d), tmp_path / "a")
    conf = json.loads((out / "config.json").read_text())
    assert (conf["num_attention_heads"], conf["num_key_value_heads"]) == (2, 2)
    with pytest.raises(ConfigError, match=r"model\.kv_heads: must divide"):  # at the edge
        RunConfig.from_dict({"model": {"hidden_size": 64, "kv_heads": 3}})
    assert RunConfig().model.kv_heads == 1


def test_a_warm_start_reports_its_steps_as_phase_progress(model_dir) -> None:  # type: ignore[no-untyped-def]
    from gyre_core.events import PhaseProgress

    d = {**LEARN, "model": {"checkpoint": str(model_dir)},
         "warm_start": {**LEARN["warm_start"], "anneal_steps": 2, "until_loss": 0.01}}  # fmt: skip
    sink = ListSink()
    factory = SessionFactory(RunConfig.from_dict(d), model_dir, sink, lambda: 0.0)
    asyncio.run(WarmStart(factory).run(factory.make_trainer()))
    seen = [(e.phase, e.done, e.total) for e in sink.of(PhaseProgress)]
    assert seen == [("warm start", k, 4) for k in range(5)] + [
        ("warm start (anneal)", k, 2) for k in range(3)
    ]
    last = sink.of(PhaseProgress)[4]
    assert last.message.startswith("loss ") and "(target 0.01)" in last.message


def test_a_warm_start_that_misses_its_target_says_so(model_dir) -> None:  # type: ignore[no-untyped-def]
    def run(until: float, steps: int = 3) -> tuple[WarmStart, ListSink]:
        d = {**LEARN, "model": {"checkpoint": str(model_dir)},
             "warm_start": {**LEARN["warm_start"], "steps": steps,
                       "until_loss": until, "cache": ""}}  # fmt: skip
        sink = ListSink()
        factory = SessionFactory(RunConfig.from_dict(d), model_dir, sink, lambda: 0.0)
        warm = WarmStart(factory)
        asyncio.run(warm.run(factory.make_trainer()))
        return warm, sink

    missed, sink = run(1e-6)  # no loss gets there in 3 steps
    assert missed.missed_target is not None and missed.missed_target > 1e-6
    last = [e for e in sink.events if e.kind == "phase_progress" and e.phase == "warm start"][-1]
    assert "NOT reached" in last.message and last.done == last.total == 3
    reached, _ = run(1e6, steps=22)  # the first full window of 20 steps is under it
    assert reached.missed_target is None
    none, _ = run(0.0)  # no target: nothing to miss
    assert none.missed_target is None


def test_rounds_follow_the_tail_until_it_settles_or_say_they_did_not(model_dir) -> None:  # type: ignore[no-untyped-def]
    from gyre_core.runtime.warm_start import missed_message

    def run(settle: float, rounds: int = 2) -> tuple[WarmStart, list[float], ListSink]:
        d = {**LEARN, "model": {"checkpoint": str(model_dir)},
             "warm_start": {**LEARN["warm_start"], "steps": 2, "anneal_steps": 2,
                       "anneal_lr": 1e-3, "settle_loss": settle,
                       "rounds": rounds, "cache": ""}}  # fmt: skip
        sink = ListSink()
        factory = SessionFactory(RunConfig.from_dict(d), model_dir, sink, lambda: 0.0)
        warm = WarmStart(factory)
        losses = asyncio.run(warm.run(factory.make_trainer()))
        return warm, losses, sink

    # No loss settles under 1e-6: 2 steps, the tail (2), then 2 rounds of 2 + 2 each.
    missed, losses, sink = run(1e-6)
    assert len(losses) == 2 + 2 + 2 * (2 + 2) and missed.anneal_from == 2
    phases = [e.phase for e in sink.of(PhaseProgress) if e.done == e.total]
    assert phases.count("warm start (round)") == 2 and phases.count("warm start (anneal)") >= 3
    assert missed.missed_target is not None and missed.missed_field.endswith("settle_loss")
    last = sink.of(PhaseProgress)[-1]
    assert "NOT reached" in last.message and "(target 1e-06)" in last.message
    assert "raise warm_start.rounds" in missed_message(missed.missed_target, missed.missed_field)
    settled, losses, _ = run(1e6)  # settled after the first tail: no round
    assert len(losses) == 4 and settled.missed_target is None
    with pytest.raises(ConfigError, match=r"warm_start\.settle_loss: needs"):
        RunConfig.from_dict({"warm_start": {"settle_loss": 0.1}})
