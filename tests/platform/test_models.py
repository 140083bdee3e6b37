"""Models and services: the status machine, event sequence numbers, tokens, GPU exclusivity,
trees."""

from __future__ import annotations

import pytest
from gyre_web.cluster import services as cluster
from gyre_web.runs import services
from gyre_web.runs.models import MetricPoint, RunEvent, Status
from gyre_web.teams import selectors as team_selectors
from gyre_web.teams import services as teams
from gyre_web.teams.models import ApiToken
from gyre_web.trajectories import selectors as traj_selectors
from gyre_web.trajectories.services import create_tree

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="e1", created_by=people["owner"])
    return services.create_run(experiment=exp, config=sim_config, launch=False)


def test_run_snapshot_is_the_validated_config(run):
    assert run.backend == "sim" and run.policy == "elastic" and run.steps == 2
    assert run.config["sim"]["rollouts"] == 32
    assert run.config["rollout"]["group_size"] >= 1  # defaults filled in by gyre_core


def test_invalid_config_reports_every_field(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="e1")
    sim_config["scheduler"]["policy"] = "greedy"
    sim_config["steps"] = 0
    with pytest.raises(services.ConfigInvalid) as info:
        services.create_run(experiment=exp, config=sim_config, launch=False)
    fields = {f for f, _ in info.value.errors}
    assert {"scheduler.policy", "steps"} <= fields


def test_status_machine_allows_the_happy_path_and_refuses_the_rest(run):
    with pytest.raises(services.IllegalTransition):
        services.transition(run.pk, Status.SUCCEEDED)
    services.transition(run.pk, Status.STARTING)
    services.transition(run.pk, Status.RUNNING)
    done = services.transition(run.pk, Status.SUCCEEDED)
    assert done.finished_at is not None and done.started_at is not None
    for target in (Status.QUEUED, Status.RUNNING, Status.FAILED):
        with pytest.raises(services.IllegalTransition):
            services.transition(run.pk, target)


def test_cancel_a_queued_run_is_immediate_and_resume_requeues(run):
    cancelled = services.request_stop(run=run)
    assert cancelled.status == Status.CANCELLED
    resumed = services.resume_run(run=cancelled)
    assert resumed.status == Status.QUEUED and resumed.resume_requested


def test_cancel_an_active_run_sets_the_flag_the_job_polls(run):
    services.transition(run.pk, Status.STARTING)
    services.transition(run.pk, Status.RUNNING)
    stopping = services.request_stop(run=run, mode="pause")
    assert stopping.status == Status.RUNNING and stopping.stop_requested == "pause"
    with pytest.raises(ValueError, match="unknown stop mode"):
        services.request_stop(run=run, mode="explode")


def test_fork_copies_the_config_with_changes_and_links_the_parent(run):
    child = services.fork_run(run=run, changes={"scheduler": {"policy": "async"}, "seed": 7})
    assert child.parent_id == run.pk and child.policy == "async" and child.seed == 7
    assert child.config["sim"] == run.config["sim"]
    assert run.config["scheduler"]["policy"] == "elastic"  # the parent is untouched


def test_events_get_contiguous_sequence_numbers_and_derive_metrics(run):
    batch = [
        {"kind": "step_finished", "t": 1.0, "wall": "2026-01-01T00:00:00+00:00",
         "data": {"step": 1, "version": 1, "metrics": {"loss": 0.5}}},
        {"kind": "benchmark", "t": 2.0, "wall": "2026-01-01T00:00:01+00:00",
         "data": {"step": 1, "suite": "repo", "score": 0.25, "tasks": 8}},
    ]  # fmt: skip
    services.append_events(run_id=run.pk, events=batch)
    services.append_events(run_id=run.pk, events=batch[:1])  # replayed step: no duplicate
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == [1, 2, 3]
    assert list(MetricPoint.objects.filter(run=run).values_list("step", "value")) == [(1, 0.5)]
    run.refresh_from_db()
    assert run.step == 1 and run.next_seq == 4
    assert run.benchmarks.get().score == 0.25


def test_api_tokens_are_stored_hashed_and_revocable(people):
    token, key = teams.create_api_token(user=people["member"], name="ci")
    stored = ApiToken.objects.get(pk=token.pk)
    assert key not in (stored.digest, stored.prefix) and len(stored.digest) == 64
    assert team_selectors.active_token(key) == token
    teams.revoke_api_token(token=token)
    assert team_selectors.active_token(key) is None


def test_a_team_keeps_its_last_owner(people):
    with pytest.raises(ValueError, match="at least one owner"):
        teams.remove_membership(team=people["team"], user=people["owner"])


def test_two_runs_never_hold_one_gpu(run, people, sim_config):
    other = services.create_run(experiment=run.experiment, config=sim_config, launch=False)
    gpu = cluster.register_gpu(node_name="n1", index=0, model="H100")
    cluster.lease_gpus(run_id=run.pk, unit_index=0, gpus=[gpu])
    cluster.lease_gpus(run_id=run.pk, unit_index=0, gpus=[gpu])  # idempotent for its holder
    with pytest.raises(cluster.GpuBusy):
        cluster.lease_gpus(run_id=other.pk, unit_index=0, gpus=[gpu])
    assert cluster.release_gpus(run_id=run.pk) == 1
    cluster.lease_gpus(run_id=other.pk, unit_index=0, gpus=[gpu])


def test_tree_nodes_get_sortable_path_keys(run):
    nodes = [
        {"id": "r", "parent": None, "preview": "system prompt"},
        {"id": "a", "parent": "r", "kind": "continue", "preview": "ls -la"},
        {"id": "b", "parent": "r", "kind": "retry", "preview": "cat README"},
        {"id": "c", "parent": "a", "kind": "compaction", "preview": "summary"},
    ]
    tree = create_tree(run_id=run.pk, group_id="g0", nodes=nodes)
    assert tree.depth == 2 and tree.branch_counts["retry"] == 1
    roots = list(traj_selectors.children(tree_id=tree.pk, parent_id=None))
    kids = list(traj_selectors.children(tree_id=tree.pk, parent_id=roots[0].pk))
    assert [k.preview for k in kids] == ["ls -la", "cat README"]
    deepest = tree.tree_nodes.get(preview="summary")
    assert [n.preview for n in traj_selectors.path_to(node=deepest)] == [
        "system prompt", "ls -la", "summary"]  # fmt: skip
    assert [n.preview for n in traj_selectors.search_nodes(tree_id=tree.pk, text="CAT")] == [
        "cat README"]  # fmt: skip
    with pytest.raises(ValueError, match="before it exists"):
        create_tree(run_id=run.pk, group_id="g1", nodes=[{"id": "x", "parent": "nope"}])


def test_path_keys_sort_like_the_tree_for_many_children(run):
    from gyre_web.trajectories.services import path_key

    assert path_key([0, 36, 46655]) == "000010zzz"
    with pytest.raises(ValueError, match="children"):
        path_key([46656])
    nodes = [{"id": "r", "parent": None}] + [
        {"id": i, "parent": "r", "preview": f"c{i}"} for i in range(40)
    ]
    tree = create_tree(run_id=run.pk, group_id="wide", nodes=nodes)
    root = traj_selectors.children(tree_id=tree.pk, parent_id=None).get()
    kids = traj_selectors.children(tree_id=tree.pk, parent_id=root.pk)
    assert [k.preview for k in kids] == [f"c{i}" for i in range(40)]
    assert root.leaves == 0 and kids[0].depth == 1
