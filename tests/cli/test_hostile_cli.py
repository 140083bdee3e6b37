"""Hostile files given to `gyre traj stats`, `gyre traj pack` and `gyre sim run` (its
workload trace and its cost file): one line ``gyre: FILE:LINE: FIELD: problem``, exit 2,
never a traceback."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gyre_core.cli.main import main
from tests.gyre_cli import gyre

DEEP = "[" * 100_000 + "]" * 100_000
BIG_INT = "1" + "0" * 5000
TURN = '{"prompt_tokens": %s, "completion_tokens": 3, "tool_s": %s}'


def _traj_line(progress: str) -> str:
    head = '{"format": "gyre.trajectory/v1", "rollout_id": "r", "task_id": "t", '
    return head + f'"status": "completed", "progress": {progress}, "calls": []}}'


def _trace_line(prompt: str = "5", tool_s: str = "1.0") -> str:
    return '{"task_id": "t", "turns": [%s], "timeout_s": 60}' % (TURN % (prompt, tool_s))


def _cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, the start of the message after ``gyre: ``)."""

    def file(name: str, *lines: str) -> str:
        path = tmp / name
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    ok_traj = _traj_line("0.5")
    ok_trace = _trace_line()
    traj = {
        "deep": (file("deep.jsonl", ok_traj, DEEP), "<line>: nested more than 64"),
        "inf": (file("inf.jsonl", ok_traj, _traj_line("1e400")), "progress: expected a finite"),
        "big": (file("big.jsonl", ok_traj, _traj_line(BIG_INT)), "<line>: an integer has more"),
    }
    costs_ok = ["--gpus", "16"]
    out = tmp / "samples.jsonl"
    cases: list[tuple[list[str], str]] = []
    for path, expect in traj.values():
        cases.append((["traj", "stats", path], f"{path}:2: {expect}"))
        cases.append(
            (
                ["traj", "pack", path, "--max-tokens", "4096", "--out", str(out)],
                f"{path}:2: {expect}",
            )
        )
    trace = {
        "deep": (file("t-deep.jsonl", ok_trace, DEEP), "<line>: nested more than 64"),
        "inf": (
            file("t-inf.jsonl", ok_trace, _trace_line(tool_s="1e400")),
            "turns[0].tool_s: expected a finite",
        ),
        "inf-int": (
            file("t-infi.jsonl", ok_trace, _trace_line(prompt="1e400")),
            "turns[0].prompt_tokens: expected an integer",
        ),
        "big": (
            file("t-big.jsonl", ok_trace, _trace_line(prompt=BIG_INT)),
            "<line>: an integer has more",
        ),
    }
    for path, expect in trace.values():
        cases.append(
            (
                ["sim", "run", "--workload", path, "--policy", "elastic", *costs_ok],
                f"{path}:2: {expect}",
            )
        )
    good_trace = file("good.jsonl", ok_trace, ok_trace.replace('"t"', '"u"'))
    for name, text, expect in [
        ("c-deep.json", DEEP, ":1: <costs>: nested more than 64"),
        ("c-big.json", f'{{"gpus": {BIG_INT}}}', ":1: <costs>: an integer has more"),
    ]:
        path = file(name, text)
        cases.append(
            (
                ["sim", "run", "--workload", good_trace, "--policy", "elastic", "--costs", path],
                f"{path}{expect}",
            )
        )
    return cases


def test_hostile_files_are_one_located_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, expect in _cases(tmp_path):
        code = main(args)
        out = capsys.readouterr()
        assert code == 2, (args, out.err[-300:])
        assert out.err.startswith(f"gyre: {expect}"), (expect, out.err[-300:])
        assert out.err.count("\n") == 1 and "Traceback" not in out.err


def test_hostile_files_in_a_real_process(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    sample = [cases[0], cases[3], cases[6]]  # stats deep, pack 1e400, sim run deep
    with ThreadPoolExecutor(max_workers=len(sample)) as pool:
        outs = list(pool.map(lambda case: gyre(*case[0]), sample))
    for (args, expect), out in zip(sample, outs, strict=True):
        assert out.returncode == 2, (args, out.stderr[-500:])
        assert out.stderr.startswith(f"gyre: {expect}") and out.stderr.count("\n") == 1
        assert "Traceback" not in out.stderr


def test_the_config_file_reader_is_bounded_too(tmp_path: Path) -> None:
    from gyre_core.config import ConfigError, load_config

    for name, text in [
        ("deep.json", DEEP),
        ("big.json", f'{{"steps": {BIG_INT}}}'),
        ("deep.yaml", "[" * 5000 + "]" * 5000),
    ]:
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert err.value.errors[0][0] == "<file>" and "cannot parse" in err.value.errors[0][1]
    path = tmp_path / "inf.json"
    path.write_text(json.dumps({"sim": {"speed": 1.0}}).replace("1.0", "1e400"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.errors == [("sim.speed", "expected a finite number, got inf")]
