"""The repository-building task suite: splits, horizons, scoring, budgets, bad input."""

from __future__ import annotations

import random
import string

import pytest

from gyre_core.envs.repo_suite import (
    ComponentSpec,
    RepoEnv,
    TaskSpec,
    load_suite,
    make_task,
    random_actions,
    rollout,
    scripted_actions,
)


def _comp(name: str, path: str | None = None) -> ComponentSpec:
    return ComponentSpec(name, "module", path or f"app/{name}.py", (("url", "x-1"),))


def test_load_suite_is_deterministic_per_seed() -> None:
    a = load_suite("train", 20, seed=3)
    assert a == load_suite("train", 20, seed=3)
    assert a != load_suite("train", 20, seed=4)
    assert [t.prompt() for t in a] == [t.prompt() for t in load_suite("train", 20, seed=3)]
    t = a[5]
    acts = scripted_actions(t)
    obs1 = [RepoEnv(t).step(x) for x in acts[:1]]
    env1, env2 = RepoEnv(t), RepoEnv(t)
    assert [env1.step(x) for x in acts] == [env2.step(x) for x in acts]
    assert obs1[0] == RepoEnv(t).step(acts[0])


def test_benchmark_vocabulary_is_disjoint_from_train() -> None:
    def vocab(split: str) -> tuple[set[str], set[str], set[str]]:
        names: set[str] = set()
        keys: set[str] = set()
        values: set[str] = set()
        for t in load_suite(split, 200, seed=0):  # type: ignore[arg-type]
            for c in t.components:
                names.add(c.name)
                keys.update(k for k, _ in c.fields)
                values.update(v.rsplit("-", 1)[0] for _, v in c.fields)
        return names, keys, values

    for tr, bm in zip(vocab("train"), vocab("benchmark"), strict=True):
        assert tr and bm
        assert not tr & bm
    train_paths = {c.path for t in load_suite("train", 200) for c in t.components}
    bench_paths = {c.path for t in load_suite("benchmark", 200) for c in t.components}
    assert not train_paths & bench_paths


@pytest.mark.parametrize("split", ["train", "benchmark"])
def test_scripted_agent_solves_the_suite(split: str) -> None:
    suite = load_suite(split, 50, seed=7)  # type: ignore[arg-type]
    scores = [rollout(RepoEnv(t), scripted_actions(t))[0] for t in suite]
    assert sum(scores) / len(scores) >= 0.9
    assert all(len(scripted_actions(t)) == t.optimal_steps for t in suite)


def test_horizons_range_from_about_ten_to_over_fifty() -> None:
    suite = load_suite("train", 60, seed=1)
    horizons = [len(scripted_actions(t)) for t in suite]
    assert min(horizons) >= 10
    assert min(len(scripted_actions(t)) for t in suite if t.size == "short") <= 20
    assert any(h >= 50 for h in horizons)
    assert all(h >= 50 for t, h in zip(suite, horizons, strict=True) if t.size == "long")
    # some tasks need fix + re-check after a failing check
    assert any("fix " in a for t in suite for a in scripted_actions(t))


def test_random_policies_score_low() -> None:
    suite = load_suite("train", 50, seed=2)
    rng = random.Random(0)
    text_scores, call_scores = [], []
    for t in suite:
        env = RepoEnv(t)
        lines = ["".join(rng.choice(string.printable) for _ in range(40)) for _ in range(100)]
        text_scores.append(rollout(env, lines)[0])
        env = RepoEnv(t)
        call_scores.append(rollout(env, random_actions(t, env.max_steps, seed=1))[0])
    assert sum(text_scores) / len(text_scores) <= 0.2
    assert sum(call_scores) / len(call_scores) <= 0.2


def test_stopping_halfway_gives_partial_credit() -> None:
    t = make_task("train", "long", seed=0)
    acts = scripted_actions(t)
    env = RepoEnv(t)
    progress, steps, _ = rollout(env, acts[: len(acts) // 2])
    assert steps == len(acts) // 2
    assert 0.2 < progress < 0.8
    assert not env.done


def test_step_budget_stops_and_keeps_progress() -> None:
    t = make_task("train", "long", seed=0)
    acts = scripted_actions(t)
    env = RepoEnv(t, max_steps=len(acts) // 2)
    progress, steps, _ = rollout(env, acts)
    assert env.done and steps == len(acts) // 2
    assert progress > 0
    after = env.step(acts[steps])
    assert after.done and not after.ok and after.progress == progress
    assert env.steps == steps


def test_malformed_calls_return_error_observations() -> None:
    t = make_task("train", "short", seed=0)
    c = t.components[0]
    env = RepoEnv(t)
    bad = [
        "",
        "   \n  ",
        "bogus tool",
        "create_file",
        "create_file nowhere/x.py",
        f"write {c.path} {c.fields[0][0]} v",  # file not created yet
        "write a b",
        "run_check",
        "run_check nonexistent",
        "fix a b",
        "submit now",
        "\x00\x01\x7f" * 10,
        "x" * 10_000,
    ]
    for line in bad:
        obs = env.step(line)
        assert not obs.ok and obs.text.startswith("error") and not obs.done
        assert obs.progress == 0.0 and obs.latency_s >= 0
    env.step(f"create_file {c.path}")
    assert not env.step(f"create_file {c.path}").ok  # already exists
    if len(c.fields) > 1:  # keys must come in spec order
        assert not env.step(f"write {c.path} {c.fields[1][0]} v").ok
    assert env.steps == len(bad) + 2 + (len(c.fields) > 1)


def test_check_reports_failures_and_a_later_write_makes_it_stale() -> None:
    c = ComponentSpec("db", "module", "app/db.py", (("url", "a-1"), ("pool", "b-2")), flaky=True)
    other = _comp("auth")
    env = RepoEnv(TaskSpec("t", "train", "short", (c, other)))
    assert env.step("create_file app/db.py").ok
    assert "missing key url" in env.step("run_check db").text
    env.step("write app/db.py url wrong")
    env.step("write app/db.py pool b-2")
    assert "wrong value for url" in env.step("run_check db").text
    env.step("write app/db.py url a-1")
    obs = env.step("run_check db")
    assert "fix db" in obs.text and obs.progress == 0.0  # flaky: fails until fixed
    assert env.step("fix db").ok
    obs = env.step("run_check db")
    assert obs.text == "PASS db" and obs.progress == 0.5
    assert env.step("write app/db.py pool b-2").progress == 0.0  # stale until re-checked
    assert env.step("run_check db").progress == 0.5
    env.step("create_file app/auth.py")
    env.step("write app/auth.py url x-1")
    obs = env.step("run_check auth")
    assert obs.done and obs.progress == 1.0


def test_submit_ends_the_episode() -> None:
    t = make_task("benchmark", "medium", seed=1)
    env = RepoEnv(t)
    obs = env.step("submit")
    assert obs.done and obs.ok and obs.progress == 0.0


def test_latencies_are_heavy_tailed() -> None:
    lats: list[float] = []
    for t in load_suite("train", 30, seed=5):
        env = RepoEnv(t)
        lats += [env.step(a).latency_s for a in scripted_actions(t)]
    lats.sort()
    median, p99 = lats[len(lats) // 2], lats[int(len(lats) * 0.99)]
    assert all(x > 0 for x in lats)
    assert p99 > 10 * median


def test_prompt_lists_every_component_but_hides_flakiness() -> None:
    t = make_task("train", "long", seed=3)
    p = t.prompt()
    for c in t.components:
        assert c.path in p and c.name in p
        assert all(f"{k}={v}" in p for k, v in c.fields)
    assert "flaky" not in p


def test_bad_specs_raise_value_errors() -> None:
    with pytest.raises(ValueError, match="empty component list"):
        TaskSpec("t", "train", "short", ())
    with pytest.raises(ValueError, match="duplicate component name 'db'"):
        TaskSpec("t", "train", "short", (_comp("db"), _comp("db", "app/db2.py")))
    with pytest.raises(ValueError, match="duplicate component path"):
        TaskSpec("t", "train", "short", (_comp("db"), _comp("auth", "app/db.py")))
    with pytest.raises(ValueError, match="no fields"):
        ComponentSpec("db", "module", "app/db.py", ())
    with pytest.raises(ValueError, match="duplicate key 'url'"):
        ComponentSpec("db", "module", "app/db.py", (("url", "a"), ("url", "b")))
    with pytest.raises(ValueError, match="without whitespace"):
        ComponentSpec("db", "module", "app/db.py", (("url", "a b"),))
    with pytest.raises(ValueError, match="unknown split"):
        load_suite("test", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps"):
        RepoEnv(make_task("train", "short", 0), max_steps=0)
