import json

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from tests.gyre_cli import gyre

SIM = {"backend": "sim", "steps": 3, "sim": {"rollouts": 96, "gpus": 16, "rollouts_per_step": 32}}


def test_sim_job_emits_the_run_and_its_steps(tmp_path) -> None:
    sink = ListSink()
    out = run_job(RunConfig.from_dict(SIM), sink=sink, workdir=tmp_path)
    kinds = [e.kind for e in sink.events]
    assert out["status"] == "succeeded" and out["steps"] == 3
    assert kinds.count("step_finished") == 3 and kinds[-1] == "run_status"
    assert kinds.count("rollout_finished") == 96


def test_should_stop_cancels_promptly(tmp_path) -> None:
    sink = ListSink()
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 20

    out = run_job(RunConfig.from_dict(SIM), sink=sink, workdir=tmp_path, should_stop=stop)
    assert out["status"] == "cancelled"
    assert len(sink.events) == 22  # 21 forwarded, then the cancelled status
    assert sink.events[-1].status == "cancelled"


def test_gyre_run_json_summary_is_the_last_line(tmp_path) -> None:
    cfg = tmp_path / "sim.json"
    cfg.write_text(json.dumps({**SIM, "scheduler": {"policy": "colocate"}}))
    out = gyre("run", str(cfg), "--json", "--workdir", str(tmp_path / "w"))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["policy"] == "colocate" and summary["sessions_restarted"] == 0
    assert "step 3" in out.stderr
