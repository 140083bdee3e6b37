"""The real backend end to end: Ray unit actors, real engines, real role switches."""

import json
import threading

import pytest

from gyre_core.config import RunConfig
from gyre_core.envs import coding
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from gyre_core.runtime.session import make_model_dir
from gyre_core.train.checkpoint_dirs import latest_checkpoint
from gyre_core.train.sharded_checkpoint import read_checkpoint
from gyre_core.train.trainer import BatchPlan
from gyre_core.trajectory.format import read_rollouts
from gyre_core.trajectory.paths import path_figures
from tests.runtime.conftest import TINY_JOB, UnitKiller, tiny_job

pytestmark = pytest.mark.slow

BASE = TINY_JOB


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from gyre_core.runtime.session import make_model_dir

    return make_model_dir(RunConfig.from_dict(BASE), tmp_path_factory.mktemp("m"))


def _cfg(model_dir, **over):
    d = {**BASE, **over, "model": {"checkpoint": str(model_dir)}}
    return RunConfig.from_dict(d)


def test_elastic_run_switches_roles_without_restarting_sessions(ray_cluster, model_dir, tmp_path):
    sink = ListSink()
    out = run_job(_cfg(model_dir), sink=sink, workdir=tmp_path)
    kinds = [e.kind for e in sink.events]
    assert out["status"] == "succeeded" and out["steps"] == 2
    assert out["sessions_restarted"] == 0 and out["role_switches"] >= 1
    assert kinds.count("step_finished") == 2 and kinds.count("benchmark") == 2
    assert kinds.count("rollout_finished") >= 4 and "tree_ready" in kinds
    phases = [(e.phase, e.done) for e in sink.events if e.kind == "phase_progress"]
    units = _cfg(model_dir).cluster.units  # the engines come up, then each benchmark runs
    assert [d for p, d in phases if p == "engine start"] == list(range(units + 1))
    bench = [d for p, d in phases if p == "benchmark"]
    assert bench.count(0) == 2 and bench == sorted(bench[: len(bench) // 2]) * 2
    to_train = [e for e in sink.events if e.kind == "role_change" and e.to_role == "train"]
    assert to_train, "elastic starts with half the units training"
    for key in (
        "benchmark_before",
        "benchmark_after",
        "calls_migrated",
        "tokens_trained",
        "dedup_vs_call",
        "wall_s",
        "policy",
    ):
        assert key in out
    assert 0.0 <= out["benchmark_after"] <= 1.0 and out["dedup_vs_call"] > 1.0
    written = [e for e in sink.events if e.kind == "rollouts_written"]  # a payload per step
    assert [e.step for e in written] == [1, 2]
    for e in written:
        records = list(read_rollouts(e.path))
        assert len(records) == e.rollouts == 2 and {r.group_id for r in records} == set(e.groups)
        assert any(c.logprobs.size for r in records for c in r.calls)


def test_resume_continues_from_the_checkpoint_without_retraining(ray_cluster, model_dir, tmp_path):
    first = run_job(_cfg(model_dir, steps=1), sink=ListSink(), workdir=tmp_path)
    assert first["steps"] == 1
    ck1 = latest_checkpoint(tmp_path / "checkpoints")
    trained1 = set(_data(ck1)["trained"])
    out = run_job(_cfg(model_dir, steps=2), sink=ListSink(), workdir=tmp_path, resume=True)
    assert out["steps"] == 2
    trained2 = set(_data(latest_checkpoint(tmp_path / "checkpoints"))["trained"])
    assert trained1 < trained2 and len(trained2) == 4  # 2 steps x 2 rollouts, none twice


def test_a_resumed_run_keeps_the_warm_started_kl_reference(ray_cluster, model_dir, tmp_path):
    # A resumed run skips the warm start; its KL reference must still be the warm-started
    # policy, not the checkpoint it was built from. With a learning rate too small to move
    # the weights, the policy at the resumed step is that reference: KL 0.
    train, warm = {"kl_coef": 0.5, "lr": 1e-12}, {"steps": 3, "demos": 1, "lr": 1e-2}
    first = run_job(_cfg(model_dir, steps=1, train=train, warm_start=warm), sink=ListSink(),
                    workdir=tmp_path)  # fmt: skip
    assert first["steps"] == 1 and (tmp_path / "reference.safetensors").exists()
    sink = ListSink()
    out = run_job(_cfg(model_dir, steps=2, train=train, warm_start=warm), sink=sink,
                  workdir=tmp_path, resume=True)  # fmt: skip
    assert out["steps"] == 2
    (resumed,) = [e for e in sink.events if e.kind == "step_finished"]
    assert abs(resumed.metrics["kl"]) < 1e-6, resumed.metrics


def test_cancel_is_prompt_and_reported(ray_cluster, model_dir, tmp_path):
    stop = threading.Event()
    sink = ListSink()

    class Watch:
        def emit(self, e):
            sink.emit(e)
            if e.kind == "rollout_started":
                stop.set()

    out = run_job(_cfg(model_dir, steps=5), sink=Watch(), workdir=tmp_path, should_stop=stop.is_set)
    assert out["status"] == "cancelled" and out["steps"] < 5
    assert sink.events[-1].kind == "run_status" and sink.events[-1].status == "cancelled"


def _data(path):
    return json.loads((path / "state.json").read_text())["data_position"]


def test_an_engine_killed_mid_run_loses_no_session(ray_cluster, model_dir, tmp_path):
    killer = UnitKiller(on="rollout_progress", role="rollout", pick=max)
    out = run_job(_cfg(model_dir), sink=killer, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 2 and killer.killed
    assert killer.roles[killer.killed[0]] == "idle", "the dead unit leaves the pool"
    started = {e.rollout_id for e in killer.events if e.kind == "rollout_started"}
    finished = {e.rollout_id for e in killer.events if e.kind == "rollout_finished"}
    assert started == finished and len(finished) == 4  # every session ran to its end
    assert out["sessions_restarted"] == 0


@pytest.mark.parametrize("fresh", [True, False])
def test_rl_after_a_warm_start_starts_with_fresh_optimizer_moments(
    ray_cluster, model_dir, tmp_path, fresh
):

    warm = {"steps": 3, "demos": 1, "fresh_optimizer": fresh}
    out = run_job(_cfg(model_dir, steps=1, warm_start=warm), sink=ListSink(), workdir=tmp_path)
    assert out["status"] == "succeeded" and out["warm_start_steps"] == 3
    ck = read_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    steps = {int(s["step"]) for s in ck["optim"]["state"].values()}
    # AdamW counts its own steps: 1 (the RL step) from fresh moments, 3 + 1 without
    assert steps == ({1} if fresh else {4})


def test_the_kl_reference_is_the_warm_started_policy(ray_cluster, model_dir, tmp_path):
    # With a warm start, RL's KL anchor is the warm-started policy (version 0), not the
    # untrained checkpoint: at the first step the policy still is that reference.
    warm = {"steps": 3, "demos": 1}
    sink = ListSink()
    out = run_job(_cfg(model_dir, steps=1, train={"kl_coef": 0.5}, warm_start=warm), sink=sink,
                  workdir=tmp_path)  # fmt: skip
    assert out["status"] == "succeeded"
    (first,) = [e for e in sink.events if e.kind == "step_finished"]
    assert abs(first.metrics["kl"]) < 1e-6, first.metrics


def test_a_run_trains_the_loss_its_config_names(ray_cluster, model_dir, tmp_path):
    # train.loss reaches the trainer of every training unit: the checkpoint records the
    # settings its trainers were built with (the loss they resolved; a tiny run's metrics
    # cannot tell the losses apart: on-policy ratios are 1 and its advantages mostly 0;
    # tests/train/test_trainer_loss.py shows each loss makes a different step)
    sink = ListSink()
    out = run_job(_cfg(model_dir, train={"loss": "pg"}), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 2
    meta = json.loads((latest_checkpoint(tmp_path / "checkpoints") / "trainer.json").read_text())
    assert (meta["settings"]["loss"], meta["settings"]["ratio_cap"]) == ("pg", 0.0)
    steps = [e.metrics for e in sink.events if e.kind == "step_finished"]
    assert len(steps) == 2 and all(m["tokens"] > 0 and m["clip_fraction"] == 0 for m in steps)


def test_a_path_sampled_run_reports_its_paths_in_each_step(ray_cluster, model_dir, tmp_path):
    # train.max_paths reaches the step: each step_finished carries the path accounting of
    # the batch its trainer sampled, the same seeded draw as BatchPlan makes offline
    sink = ListSink()
    cfg = _cfg(model_dir, seed=3, train={"max_paths": 1})
    summary = run_job(cfg, sink=sink, workdir=tmp_path)
    assert summary["status"] == "succeeded"
    steps = [e.metrics for e in sink.events if e.kind == "step_finished"]
    written = [e for e in sink.events if e.kind == "rollouts_written"]
    assert len(steps) == len(written) == 2
    plan = BatchPlan(cfg.train, cfg.scheduler.staleness_bound, cfg.seed)
    for metrics, e in zip(steps, written, strict=True):
        trees = plan.weigh(list(read_rollouts(e.path)), e.step - 1)
        want = path_figures(trees.values())
        assert {k: metrics[k] for k in want} == want
        assert metrics["paths_taken"] == e.rollouts  # one path of each rollout
        assert metrics["tokens_trained"] <= metrics["tokens_stored"]
    # the run's summary sums them over its steps (learning_bench prints it)
    assert summary["paths"] == {k: sum(m[k] for m in steps) for k in want}


def _weights(workdir):
    return read_checkpoint(latest_checkpoint(workdir / "checkpoints"))["model"]


def test_a_colocate_run_repeats_exactly(ray_cluster, tmp_path):
    # Colocate trains only on-policy tokens, on every unit, on the whole batch at once. With
    # the trainer's own behaviour log-probs (so which calls shared an engine batch cannot
    # matter) and rollouts in a canonical order, the same seed gives the same run: every
    # step's metrics and the final weights, bit for bit. The learning demo's model, warm
    # started a little so that sessions run several calls: measured with
    # train.behaviour=recorded, the two runs' metrics differ here.
    train = {"behaviour": "trainer", "lr": 1e-2}
    warm = {"steps": 40, "demos": 2, "lr": 1e-2}
    job = {**tiny_job("colocate"), "steps": 3, "checkpoint_every": 1, "train": train,
           "warm_start": warm,
           "model": {"hidden_size": 128, "kv_heads": 4, "tokenizer": "suite",
                     "tie_embeddings": False}}  # fmt: skip
    job["rollout"] = {**job["rollout"], "tasks_per_step": 2, "group_size": 8,
                      "max_new_tokens": 16, "max_turns": 12}  # fmt: skip
    runs = []
    for k in range(2):
        sink = ListSink()
        model = make_model_dir(RunConfig.from_dict(job), tmp_path / "model")
        d = {**job, "model": {"checkpoint": str(model)}}
        out = run_job(RunConfig.from_dict(d), sink=sink, workdir=tmp_path / f"run{k}")
        assert out["status"] == "succeeded" and out["steps"] == 3
        steps = [e.metrics for e in sink.events if e.kind == "step_finished"]
        runs.append((steps, _weights(tmp_path / f"run{k}")))
    (steps_a, weights_a), (steps_b, weights_b) = runs
    keys = ("loss", "entropy", "grad_norm", "ratio_mean", "tokens", "reward", "progress")
    assert [[a[k] for k in keys] for a in steps_a] == [[b[k] for k in keys] for b in steps_b]
    assert weights_a.keys() == weights_b.keys()
    diff = max(float((weights_a[k] - weights_b[k]).abs().max()) for k in weights_a)
    assert diff == 0.0


def test_index_batch_order_trains_each_steps_own_rollouts(ray_cluster, model_dir, tmp_path):
    scheduler = {"policy": "async", "drain_deadline_s": 0.0, "batch_order": "index"}
    sink = ListSink()
    out = run_job(_cfg(model_dir, steps=3, scheduler=scheduler), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 3
    written = [e for e in sink.events if e.kind == "rollouts_written"]
    assert [e.step for e in written] == [1, 2, 3]
    for e in written:  # step k trains sessions 2(k-1) and 2(k-1)+1: its own task's group
        ids = sorted(r.rollout_id for r in read_rollouts(e.path))
        assert ids == [f"r{2 * (e.step - 1)}", f"r{2 * (e.step - 1) + 1}"]


def test_boundary_dispatch_starts_a_burst_only_once_the_last_has_ended(
    ray_cluster, model_dir, tmp_path
):
    scheduler = {"policy": "async", "dispatch": "boundary", "burst_steps": 2}
    sink = ListSink()
    out = run_job(_cfg(model_dir, steps=4, scheduler=scheduler), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 4
    ended: set[int] = set()  # a burst is 2 steps of 2 sessions: r0-r3, r4-r7
    for e in sink.events:
        if e.kind == "rollout_started":
            burst = int(e.rollout_id[1:]) // 4
            assert ended >= set(range(4 * burst)), f"{e.rollout_id} began before its burst"
        elif e.kind == "rollout_finished":
            ended.add(int(e.rollout_id[1:]))
    assert ended == set(range(8))


def test_benchmark_every_scores_versions_during_the_run(ray_cluster, model_dir, tmp_path):
    cfg = _cfg(model_dir, rollout={**BASE["rollout"], "benchmark_every": 1})
    sink = ListSink()
    out = run_job(cfg, sink=sink, workdir=tmp_path)
    assert sorted(e.step for e in sink.events if e.kind == "benchmark") == [0, 1, 2]
    assert sorted(out["benchmark_by_version"]) == [0, 1, 2]


def test_a_coding_run_draws_more_tasks_than_the_suite_has(ray_cluster, model_dir, tmp_path):
    """The coding suite has four tasks; a run draws six (three steps of two), so its task
    indices go round the pool."""
    rollout = {**BASE["rollout"], "suite": "coding", "tasks_per_step": 2}
    sink = ListSink()
    out = run_job(_cfg(model_dir, steps=3, rollout=rollout), sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 3
    tasks = {e.task_id for e in sink.events if e.kind == "rollout_started"}
    assert tasks == {f"coding-{name}" for name in coding.TASKS}


def test_two_processes_a_unit_train_sharded_with_no_model_on_the_driver(
    ray_cluster, model_dir, tmp_path
):
    # cluster.gpus_per_unit is processes per unit: 2 units x 2 processes take the fixture's
    # 4 gpu_unit. Whichever units train, each of their processes writes its own shards.
    sink = ListSink()
    cfg = _cfg(model_dir, cluster={"units": 2, "gpus_per_unit": 2})
    out = run_job(cfg, sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 2
    ck = latest_checkpoint(tmp_path / "checkpoints")
    shards = sorted(p.name for p in ck.glob("*.distcp"))
    assert len(shards) >= 2, shards  # a training unit's 2 processes, or more
    weights = read_checkpoint(ck)["model"]
    assert weights["model.embed_tokens.weight"].shape[0] == 1024  # whole, from the shards
    joins = [e for e in sink.events if e.kind == "role_change" and e.parts.get("reform_s")]
    assert joins, "a unit entering training re-forms the group and says how long it took"


def test_a_streaming_run_trains_on_a_core_and_satellites(ray_cluster, model_dir, tmp_path):
    """``scheduler.streaming``: the world forms once over the 4 units; the units that
    train are always a prefix of the ranks (core first), each step is the core's with its
    satellites, and the run resumes from the core's checkpoint."""
    scheduler = {**BASE["scheduler"], "streaming": True}
    rollout = {**BASE["rollout"], "tasks_per_step": 4}  # 4 groups: a step opens on the first
    cfg = _cfg(model_dir, steps=3, scheduler=scheduler, rollout=rollout)
    sink = ListSink()
    out = run_job(cfg, sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["steps"] == 3
    roles: dict[int, str] = {}
    for e in sink.events:
        if e.kind == "role_change":
            roles[e.unit] = e.to_role
            training = sorted(u for u, r in roles.items() if r in ("train", "switching"))
            assert training == list(range(len(training))) or e.to_role != "train", roles
    steps = [e.metrics for e in sink.events if e.kind == "step_finished"]
    assert len(steps) == 3 and all(m["stream_members"] >= 1 for m in steps)
    assert all(m["stream_micro_steps"] >= m["stream_core_micro_steps"] for m in steps)
    assert all(2 <= m["stream_opened_on"] <= 8 for m in steps)  # at least a whole group
    print("opened on", [m["stream_opened_on"] for m in steps])
    ck = latest_checkpoint(tmp_path / "checkpoints")
    assert ck is not None and "optim" in read_checkpoint(ck)  # the core's, with its moments
    more = _cfg(model_dir, steps=4, scheduler=scheduler, rollout=rollout)
    again = run_job(more, sink=ListSink(), workdir=tmp_path, resume=True)
    assert again["status"] == "succeeded" and again["steps"] == 4


def test_a_streaming_run_warm_starts_on_its_core(ray_cluster, model_dir, tmp_path):
    """The warm start's supervised steps run on the core; RL then goes on from its moments
    (AdamW's step count 3 + 1) and anchors its KL at the warm-started policy."""
    scheduler = {**BASE["scheduler"], "streaming": True}
    warm = {"steps": 3, "demos": 1, "fresh_optimizer": False}
    cfg = _cfg(model_dir, steps=1, scheduler=scheduler, warm_start=warm, train={"kl_coef": 0.5})
    sink = ListSink()
    out = run_job(cfg, sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded" and out["warm_start_steps"] == 3
    ck = read_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert {int(s["step"]) for s in ck["optim"]["state"].values()} == {4}
    (first,) = [e for e in sink.events if e.kind == "step_finished"]
    assert abs(first.metrics["kl"]) < 1e-6, first.metrics


def test_a_streaming_run_cancelled_with_a_step_open_stops(ray_cluster, model_dir, tmp_path):
    """Cancelled as soon as its first step has opened (the core's snapshot of it is in the
    work folder), on its first group of 8 (rollouts of up to 8 turns, so the others take a
    while): the step still waiting for its groups is dropped, and the run stops at once
    instead of waiting for groups that will not come (without the drop it hangs: checked).
    A step may still finish first where its last groups beat the stop's check."""
    opened = tmp_path / "stream" / "step-0.pt"
    sink = ListSink()
    scheduler = {**BASE["scheduler"], "streaming": True}
    rollout = {**BASE["rollout"], "tasks_per_step": 8, "max_turns": 8, "max_new_tokens": 48}
    cfg = _cfg(model_dir, steps=3, scheduler=scheduler, rollout=rollout)
    out = run_job(cfg, sink=sink, workdir=tmp_path, should_stop=opened.exists)
    finished = [e for e in sink.events if e.kind == "step_finished"]
    assert out["status"] == "cancelled" and out["steps"] == len(finished) <= 1
