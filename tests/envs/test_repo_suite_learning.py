"""The repo suite's learning aids: the held-out split of unseen tasks, the status line,
and oracle transcripts for the tokenizer corpus."""

from __future__ import annotations

from gyre_core.envs.repo_suite import (
    SPLITS,
    RepoEnv,
    load_suite,
    make_task,
    rollout,
    scripted_actions,
    transcripts,
)
from gyre_core.rollout.task_env import make_env


def _words(split: str) -> set[str]:
    out: set[str] = set()
    for t in load_suite(split, 200, seed=0):  # type: ignore[arg-type]
        for c in t.components:
            out.add(c.name)
            out.update(k for k, _ in c.fields)
            out.update(v.rsplit("-", 1)[0] for _, v in c.fields)
    return out


def test_heldout_split_is_new_tasks_in_the_train_vocabulary() -> None:
    assert SPLITS == ("train", "benchmark", "heldout")
    assert _words("heldout") <= _words("train")
    assert not _words("heldout") & _words("benchmark")
    train = {t.components for t in load_suite("train", 300, seed=0)}
    held = load_suite("heldout", 300, seed=0)
    assert not [t for t in held if t.components in train]  # no task is shared
    assert all(t.task_id.startswith("heldout-") for t in held)
    assert held == load_suite("heldout", 300, seed=0)


def test_status_line_tracks_the_component_in_progress() -> None:
    spec = make_task("train", "short", 4)
    env = RepoEnv(spec, hints=True)
    first = spec.components[0]
    assert env.reset().text.endswith(f"\nfocus: {first.path} missing")
    obs = env.step(f"create_file {first.path}")
    (k0, v0), (k1, v1) = first.fields[:2]
    assert obs.text == f"created {first.path}\nfocus: {first.path} {k0} {v0}"
    obs = env.step(f"write {first.path} {k0} {v0}")
    assert obs.text.endswith(f"\nfocus: {first.path} {k1} {v1}")
    for k, v in first.fields[1:]:
        obs = env.step(f"write {first.path} {k} {v}")
    second = spec.components[1]
    # written in full: the focus moves on and the bar says what is untested
    assert obs.text.endswith(f"\nuntested: {first.name} | focus: {second.path} missing")
    obs = env.step("bogus")  # errors carry the status line too
    assert not obs.ok and obs.text.endswith(
        f"untested: {first.name} | focus: {second.path} missing"
    )
    for c in spec.components[1:]:
        env.step(f"create_file {c.path}")
        for k, v in c.fields:
            env.step(f"write {c.path} {k} {v}")
    last = spec.components[-1]
    # every file written, none checked: the bar names the latest (the one just written)
    assert env.status_line() == f"untested: {last.name}"
    env.step(f"run_check {last.name}")
    if last.flaky:
        assert env.status_line() == f"untested: {last.name}"  # a failed check is no pass
        env.step(f"fix {last.name}")
        env.step(f"run_check {last.name}")
    assert env.status_line() == f"untested: {spec.components[-2].name}"


def test_status_line_is_off_by_default_and_gone_when_done() -> None:
    spec = make_task("heldout", "short", 1)
    plain = RepoEnv(spec)
    assert "focus:" not in plain.reset().text
    assert all("focus:" not in plain.step(a).text for a in scripted_actions(spec))
    env = RepoEnv(spec, hints=True)
    env.reset()
    progress, _, _ = rollout(env, scripted_actions(spec))
    assert progress == 1.0 and env.status_line() == ""


def test_make_env_passes_hints_and_heldout() -> None:
    env = make_env("repo", "heldout", 0, seed=0, hints=True)
    assert env.task_id.startswith("heldout-") and "\nfocus: " in env.reset()


def test_transcripts_replay_the_oracle() -> None:
    texts = transcripts("heldout", 3, seed=5, sizes=("short",), hints=True)
    spec = load_suite("heldout", 3, seed=5, sizes=("short",))[0]
    lines = texts[0].splitlines()
    for action in scripted_actions(spec):
        assert action in lines
    assert lines[-1] == "all checks pass" and "focus:" in texts[0]


def test_credit_counts_files_keys_and_checks_before_progress_moves() -> None:
    spec = make_task("train", "short", 2)
    env = RepoEnv(spec)
    env.reset()
    units = sum(len(c.fields) + 2 for c in spec.components)
    first = spec.components[0]
    assert env.credit == 0.0
    env.step(f"create_file {first.path}")
    assert env.credit == 1 / units and env.progress == 0.0
    k, v = first.fields[0]
    env.step(f"write {first.path} {k} wrong-1")  # a wrong value earns nothing
    assert env.credit == 1 / units
    env.step(f"write {first.path} {k} {v}")  # rewriting the key fixes it
    assert env.credit == 2 / units
    seen = []
    for action in scripted_actions(spec):
        env.step(action)
        seen.append(env.credit)
    assert seen == sorted(seen) and env.credit == 1.0 and env.progress == 1.0
