"""`gyre traj` as a user runs it: a real subprocess, real files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gyre_core.trajectory.format import read_rollouts
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.tree import build_trees
from tests.gyre_cli import gyre

STATS_KEYS = {
    "rollouts", "groups", "calls", "tokens_per_call", "tokens_per_branch", "tokens_unique",
    "trainable_tokens_unique", "dedup_vs_call", "dedup_vs_branch", "calls_by_kind",
    "rollouts_by_status",
}  # fmt: skip
PACK_KEYS = {"samples", "max_tokens", "tokens_packed", "packing_overhead", "largest_sample"}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "agentic.jsonl"
    out = gyre(
        "traj", "synth", "--preset", "agentic", "--groups", "2", "--out", str(path), "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["rollouts"] == 2 * 8
    return path


def test_stats_json_matches_the_library(log: Path) -> None:
    out = gyre("traj", "stats", str(log), "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert set(stats) >= STATS_KEYS
    assert stats == tree_stats(build_trees(read_rollouts(log)).values())
    assert stats["dedup_vs_branch"] == round(stats["tokens_per_branch"] / stats["tokens_unique"], 4)
    assert stats["tokens_per_call"] > stats["tokens_per_branch"] > stats["tokens_unique"]


def test_pack_writes_bounded_samples_covering_every_generated_token(
    log: Path, tmp_path: Path
) -> None:
    out_path = tmp_path / "samples.jsonl"
    out = gyre("traj", "pack", str(log), "--max-tokens", "20000", "--out", str(out_path),
               "--advantage-mode", "per_path", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert set(summary) >= PACK_KEYS
    samples = [PackedSample.from_json(json.loads(line)) for line in out_path.open()]
    assert len(samples) == summary["samples"]
    assert max(len(s) for s in samples) == summary["largest_sample"] <= 20000
    assert sum(len(s) for s in samples) == summary["tokens_packed"]
    stats = json.loads(gyre("traj", "stats", str(log), "--json").stdout)
    assert sum(int(s.trainable.sum()) for s in samples) == stats["trainable_tokens_unique"]
    expect = round(summary["tokens_packed"] / stats["tokens_unique"] - 1, 4)
    assert summary["packing_overhead"] == expect
    for s in samples:
        assert (s.parent < np.arange(len(s))).all()
        assert np.isnan(s.logprob[~s.trainable]).all() and (s.advantage[~s.trainable] == 0).all()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "gyre.trajectory/v1", "rollout_id": "r", "task_id": "t",'
                   ' "status": "completed", "progress": 2, "calls": []}\n')  # fmt: skip
    out = gyre("traj", "stats", str(bad))
    assert out.returncode == 2
    assert out.stderr.strip() == f"gyre: {bad}:1: progress: must be in [0, 1], got 2.0"
    assert "Traceback" not in out.stderr
    missing = gyre("traj", "stats", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "nope.jsonl: No such file or directory" in missing.stderr


def test_a_path_longer_than_the_bound_is_cut_and_reported(log: Path, tmp_path: Path) -> None:
    """An over-long rollout never fails packing: the positions at depth >= --max-tokens
    are cut and counted; every other generated position is trained exactly once."""
    out_path = tmp_path / "x.jsonl"
    out = gyre("traj", "pack", str(log), "--max-tokens", "100", "--out", str(out_path), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    trees = build_trees(read_rollouts(log)).values()
    deep = sum(n.end - max(n.start, 100) for t in trees for n in t.nodes() if n.end > 100)
    assert summary["tokens_cut"] == deep > 0
    samples = [PackedSample.from_json(json.loads(line)) for line in out_path.open()]
    assert (
        summary["largest_sample"] <= 100 and int(max(s.position_ids.max() for s in samples)) < 100
    )
    shallow = sum(
        int(n.generated[: max(0, min(len(n), 100 - n.start))].sum())
        for t in trees
        for n in t.nodes()
    )
    assert summary["trainable_tokens"] == shallow
    usage = gyre("traj", "pack", str(log), "--max-tokens", "0", "--out", str(tmp_path / "x.jsonl"))
    assert usage.returncode == 2 and "expected a positive integer" in usage.stderr


def test_pack_with_max_paths_prints_the_path_accounting(log: Path, tmp_path: Path) -> None:
    def pack(*extra: str) -> dict:
        out = gyre("traj", "pack", str(log), "--max-tokens", "40000", "--out",
                   str(tmp_path / "p.jsonl"), "--json", *extra)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    every, five, one = pack(), pack("--max-paths", "5", "--seed", "3"), pack("--max-paths", "1")
    stored = every["tokens_stored"]
    assert every["tokens_trained"] == stored == every["trainable_tokens"]
    assert every["paths_taken"] == every["paths_total"] == five["paths_total"]
    assert one["paths_taken"] == 2 * 8  # one path of each of the 16 rollouts
    assert one["paths_taken"] < five["paths_taken"] < every["paths_taken"]
    assert one["tokens_trained"] < five["tokens_trained"] < stored == five["tokens_stored"]
    assert five["tokens_trained"] == five["trainable_tokens"]  # what the samples train
    assert five["tokens_packed"] < every["tokens_packed"]  # pruned subtrees are not packed
    assert pack("--max-paths", "5", "--seed", "3") == five  # seeded: the same draws again
    bad = gyre("traj", "pack", str(log), "--max-tokens", "40000", "--out",
               str(tmp_path / "p.jsonl"), "--path-roles", "main,boss")  # fmt: skip
    assert bad.returncode == 2 and "path roles must be distinct names" in bad.stderr


def _line(rid: str, group: str, status: str, calls: list[dict[str, object]], **more: object) -> str:
    return json.dumps({"format": "gyre.trajectory/v1", "rollout_id": rid, "task_id": "t",
                       "group_id": group, "status": status, "progress": 0.0, "calls": calls,
                       **more})  # fmt: skip


CALL = {"call_id": "c0", "prompt_ids": [1, 2], "completion_ids": [3, 4], "logprobs": [-0.1, -0.2],
        "versions": 0}  # fmt: skip


def test_a_group_whose_rollouts_made_no_call_packs_to_nothing(tmp_path: Path) -> None:
    """Issue #44 bug 1: rollouts that failed before their first call (any agent that dies
    on an import error or a bad key) made an empty tree, and packing it crashed."""
    path = tmp_path / "empty.jsonl"
    lines = [_line(f"a{i}", "ga", "failed", []) for i in range(3)]  # no failure: the agent's
    lines += [_line(f"b{i}", "gb", "completed", []) for i in range(2)]  # completed, no call
    lines += [_line("c0", "gc", "completed", [CALL]), _line("c1", "gc", "completed", [CALL])]
    path.write_text("\n".join(lines) + "\n")
    out = gyre("traj", "pack", str(path), "--max-tokens", "16", "--out", str(tmp_path / "o"),
               "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["excluded_agent"], summary["empty_trees"], summary["groups_untrained"]) == (
        3,
        1,
        1,
    )  # ga: no scored rollout at all; gb: scored, but an empty tree
    assert summary["samples"] == 1 and summary["trainable_tokens"] == 2


def test_pack_counts_rollouts_left_out_by_cause(tmp_path: Path) -> None:
    """Infrastructure failures and dropped evaluations stay out of their group: a group
    left with one scored rollout trains nothing."""
    path = tmp_path / "causes.jsonl"
    lines = [
        _line("r0", "g", "completed", [CALL], progress=1.0),
        _line("r1", "g", "failed", [CALL], failure="environment"),
        _line("r2", "g", "failed", [], failure="engine"),
        _line("r3", "g", "failed", [CALL], failure="evaluation"),
        _line("r4", "h", "completed", [CALL], progress=1.0),
        _line("r5", "h", "failed", [CALL], failure="agent"),  # after a call: a scored 0
    ]
    path.write_text("\n".join(lines) + "\n")
    out = gyre("traj", "pack", str(path), "--max-tokens", "16", "--out", str(tmp_path / "o"),
               "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    got = {k: s[k] for k in ("excluded_environment", "excluded_engine", "excluded_agent",
                             "dropped_evaluation", "groups_untrained", "empty_trees")}  # fmt: skip
    assert got == {"excluded_environment": 1, "excluded_engine": 1, "excluded_agent": 0,
                   "dropped_evaluation": 1, "groups_untrained": 1, "empty_trees": 0}  # fmt: skip
