"""`gyre sim` as a user runs it: a real subprocess, real files."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gyre_core.cli.main import main
from gyre_core.events import EVENT_TYPES
from gyre_core.sim.workload import describe, read_trace
from tests.gyre_cli import gyre

SMALL = ("--gpus", "32", "--rollouts-per-step", "16")  # 4 units; 64 rollouts make 4 steps
SUMMARY_KEYS = {
    "policy", "switch_mode", "makespan_s", "steps", "rollouts", "tokens_trained",
    "tokens_masked", "staleness_histogram", "lower_bound_s", "efficiency",
    "gpu_seconds_by_role", "train_busy_gpu_s", "sessions_restarted", "calls_migrated",
    "tokens_reprefilled", "tokens_discarded", "role_switches", "timeouts", "events", "units",
    "gpus", "goodput_tok_s", "peak_rollouts",
}  # fmt: skip
COMPARE_KEYS = {"colocate", "async", "elastic", "async_splits", "elastic_vs_colocate",
                "elastic_vs_async", "makespan_vs_colocate", "makespan_vs_async",
                "batch_order"}  # fmt: skip


def ok(*args: str) -> str:
    out = gyre(*args)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "mixed.jsonl"
    stats = json.loads(ok("sim", "workload", "--kind", "mixed", "--rollouts", "64", "--seed",
                          "0", "--out", str(path), "--json"))  # fmt: skip
    assert stats["rollouts"] == 64 and stats["out"] == str(path)
    assert {k: v for k, v in stats.items() if k != "out"} == describe(read_trace(path))
    return path


@pytest.fixture(scope="module")
def compared(trace: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        ok("sim", "compare", "--workload", str(trace), *SMALL, "--json")
    )
    return result


def test_workload_human_form_and_group_size(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    out = gyre("sim", "workload", "--kind", "uniform", "--rollouts", "10", "--seed", "3",
               "--group-size", "4", "--out", str(path))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "10 rollouts" in out.stdout and "duration_s" in out.stdout
    groups = [r.group_id for r in read_trace(path)]
    assert [groups.count(g) for g in dict.fromkeys(groups)] == [4, 4, 2]


def test_run_each_policy_prints_its_summary(trace: Path, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    summary = json.loads(ok("sim", "run", "--workload", str(trace), "--policy", "elastic",
                            *SMALL, "--events", str(events), "--json"))  # fmt: skip
    assert set(summary) >= SUMMARY_KEYS
    assert summary["policy"] == "elastic" and summary["units"] == 4 and summary["steps"] == 4
    lines = [json.loads(line) for line in events.open()]
    assert {e["kind"] for e in lines} <= set(EVENT_TYPES)
    assert sum(e["kind"] == "step_finished" for e in lines) == summary["steps"]
    assert sum(e["kind"] == "rollout_finished" for e in lines) == summary["rollouts"]

    split = json.loads(ok("sim", "run", "--workload", str(trace), "--policy", "async",
                          "--split", "1:3", *SMALL, "--json"))  # fmt: skip
    assert split["policy"] == "async" and split["split"] == "1:3"

    human = ok("sim", "run", "--workload", str(trace), "--policy", "colocate", *SMALL,
               "--switch-mode", "restart")  # fmt: skip
    rows = dict(line.split(None, 1) for line in human.splitlines())
    assert rows["policy"].strip() == "colocate" and rows["switch_mode"].strip() == "restart"
    assert float(rows["makespan_s"]) > 0


def test_cost_file_with_explicit_options_overriding_it(trace: Path, tmp_path: Path) -> None:
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"gpus": 32, "rollouts_per_step": 16, "train_tok_s": 9000}))
    base = ["sim", "run", "--workload", str(trace), "--policy", "async", "--json"]
    from_file = json.loads(ok(*base, "--costs", str(table)))
    assert from_file["units"] == 4 and from_file["steps"] == 4
    overridden = json.loads(ok(*base, "--costs", str(table), "--gpus", "64"))
    assert overridden["units"] == 8 and overridden["gpus"] == 64 and overridden["steps"] == 4


def test_compare_json_ratios_and_best_split(compared: dict[str, Any], trace: Path) -> None:
    r = compared
    assert set(r) >= COMPARE_KEYS
    summaries = {p: r[p] for p in ("colocate", "async", "elastic")}
    for policy, s in summaries.items():
        assert isinstance(s, dict) and set(s) >= SUMMARY_KEYS and s["policy"] == policy
    splits = r["async_splits"]
    assert isinstance(splits, list)
    assert [e["split"] for e in splits] == ["1:3", "2:2", "3:1"]  # 4 units: every split
    chosen = summaries["async"]["split"]
    goodputs = {e["split"]: e["goodput_tok_s"] for e in splits}
    fewest = min(e["timeouts"] for e in splits)
    eligible = {e["split"] for e in splits if e["timeouts"] <= fewest + 0.01 * 64}
    assert chosen in eligible
    assert goodputs[chosen] == max(goodputs[x] for x in eligible)
    assert goodputs[chosen] == summaries["async"]["goodput_tok_s"]
    g = summaries["elastic"]["goodput_tok_s"]
    assert r["elastic_vs_colocate"] == round(g / summaries["colocate"]["goodput_tok_s"], 4)
    assert r["elastic_vs_async"] == round(g / summaries["async"]["goodput_tok_s"], 4)
    e = summaries["elastic"]["makespan_s"]
    assert r["makespan_vs_async"] == round(summaries["async"]["makespan_s"] / e, 4)
    for s in summaries.values():
        unmasked = s["tokens_trained"] - s["tokens_masked"]
        assert s["goodput_tok_s"] == round(unmasked / s["makespan_s"], 3)
    # `run` at the chosen split reproduces compare's async figures: same trace, same costs.
    run = json.loads(ok("sim", "run", "--workload", str(trace), "--policy", "async",
                        "--split", chosen, *SMALL, "--json"))  # fmt: skip
    assert run == summaries["async"]


def test_compare_human_form_with_progress(compared: dict[str, Any], trace: Path) -> None:
    out = gyre("sim", "compare", "--workload", str(trace), *SMALL, "--progress")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split()[:4] == ["policy", "split", "goodput_tok_s", "makespan_s"]
    assert [line.split()[0] for line in lines[2:5]] == ["colocate", "async", "elastic"]
    chosen = compared["async"]["split"]
    assert any(line.startswith(f"async split {chosen}:") for line in lines)
    c, a = compared["elastic_vs_colocate"], compared["elastic_vs_async"]
    assert f"goodput   elastic vs colocate {c:.4f}x, vs async {a:.4f}x" in out.stdout
    c, a = compared["makespan_vs_colocate"], compared["makespan_vs_async"]
    assert f"makespan  elastic vs colocate {c:.4f}x, vs async {a:.4f}x" in out.stdout
    progress = [line for line in out.stderr.splitlines() if line.startswith("gyre sim compare:")]
    assert len(progress) == 2 + len(compared["async_splits"])
    quiet = gyre("sim", "compare", "--workload", str(trace), *SMALL, "--json")
    assert quiet.stderr == ""  # stderr is not a TTY and no --progress: no progress lines


def _bad_cost_files(tmp: Path) -> dict[str, Path]:
    files = {
        "type": '{"gpus": "32"}',
        "value": '{"train_tok_s": -1}',
        "json": '{"gpus": ',
        "unknown": '{"gpu": 32}',
    }
    out = {}
    for name, text in files.items():
        out[name] = tmp / f"{name}.json"
        out[name].write_text(text)
    return out


def _error_cases(trace: Path, tmp_path: Path) -> list[tuple[list[str], str]]:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(trace.read_text().splitlines()[0] + "\n" + '{"task_id": "t", "turns": []}\n')
    costs = _bad_cost_files(tmp_path)
    run = ["sim", "run", "--workload", str(trace), "--policy"]
    return [
        (["sim", "run", "--workload", str(bad), "--policy", "elastic"], f"{bad}:2: turns:"),
        (["sim", "compare", "--workload", str(bad)], f"{bad}:2: turns:"),
        ([*run, "elastic", "--workload", str(tmp_path / "none.jsonl")], "No such file"),
        ([*run, "elastic", "--gpus", "8", "--gpus-per-unit", "8"], "--gpus 8 --gpus-per-unit 8"),
        (["sim", "compare", "--workload", str(trace), "--gpus", "8"], "1 unit(s) of 8"),
        ([*run, "async", *SMALL, "--split", "2-2"], "--split '2-2': expected R:T"),
        ([*run, "async", *SMALL, "--split", "2:3"], "--split 2:3 does not add up"),
        ([*run, "async", *SMALL, "--split", "0:4"], "--split 0:4: each side needs"),
        ([*run, "elastic", *SMALL, "--split", "2:2"], "--split applies to --policy async"),
        ([*run, "elastic", "--train-tok-s", "-5"], "--train-tok-s: must be > 0"),
        ([*run, "elastic", "--train-tok-s", "fast"], "--train-tok-s: invalid float value"),
        ([*run, "elastic", "--switch-s", "inf"], "--switch-s: must be finite"),
        ([*run, "elastic", "--rollouts-per-step", "12"], "not a multiple of --group-size"),
        ([*run, "elastic", "--rollouts-per-step", "128"], "fewer than one step"),
        ([*run, "elastic", "--switch-mode", "pause"], "--switch-mode: invalid choice"),
        ([*run, "elastic", "--costs", str(costs["type"])], "type.json: gpus: expected an int"),
        ([*run, "elastic", "--costs", str(costs["value"])], "value.json: --train-tok-s: must"),
        ([*run, "elastic", "--costs", str(costs["json"])], "json.json:1: <costs>: invalid JSON"),
        ([*run, "elastic", "--costs", str(costs["unknown"])], "unknown.json: gpu: unknown"),
        (["sim", "workload", "--kind", "xlong", "--rollouts", "0", "--seed", "0", "--out",
          str(tmp_path / "w.jsonl")], "--rollouts: expected a positive integer"),
    ]  # fmt: skip


def test_bad_input_is_one_line_and_exit_2(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every error case through ``main`` in this process (an interpreter start each would
    cost ~0.5 s); the subprocess test below runs a sample of them for real."""
    for args, expect in _error_cases(trace, tmp_path):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse's own errors
            code = int(exc.code or 0)
        out = capsys.readouterr()
        assert code == 2, (args, out.out, out.err)
        assert out.out == "", args
        assert out.err.startswith("gyre: ") and out.err.count("\n") == 1, out.err
        assert expect in out.err, (expect, out.err)


def test_bad_input_in_a_real_process(trace: Path, tmp_path: Path) -> None:
    cases = _error_cases(trace, tmp_path)
    sample = [cases[i] for i in (0, 4, 5, 10, 17)]  # trace, cluster, split, option, cost file
    with ThreadPoolExecutor(max_workers=len(sample)) as pool:
        outs = list(pool.map(lambda case: gyre(*case[0]), sample))
    for (args, expect), out in zip(sample, outs, strict=True):
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith("gyre: ") and expect in out.stderr, (expect, out.stderr)
