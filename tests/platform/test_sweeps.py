"""Sweeps: grid and random expansion, validation errors naming the field, the cap on
started runs holding while workers take and end runs (also when runs end at once in
concurrent transactions), cancel, and what the API answers."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from django.db import connection
from gyre_web.runs import services as runs
from gyre_web.runs.models import ACTIVE, LaunchOutbox, Run, Status
from gyre_web.sweeps import expand, services
from gyre_web.sweeps.models import Sweep

pytestmark = pytest.mark.django_db
ENDED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
_names = itertools.count()


def _sweep(people: Any, config: dict[str, Any], **kw: Any) -> Sweep:
    exp = runs.create_experiment(team=people["team"], name=f"sweeps {next(_names)}")
    spec = {"mode": "grid", "params": {"seed": [1, 2, 3, 4, 5]}, "max_concurrent": 2, **kw}
    return services.create_sweep(experiment=exp, base_config=config, **spec)


def _started_active(sweep: Sweep) -> list[int]:
    rows = Run.objects.filter(sweep_run__sweep=sweep, status__in=ACTIVE, launches__isnull=False)
    return sorted(set(rows.values_list("pk", flat=True)))


def _work(run_id: int, end: str = Status.SUCCEEDED) -> None:
    """What a worker does with a launched run: claim it, run it, end it."""
    task_id = Run.objects.get(pk=run_id).celery_task_id
    assert runs.claim_launch(run_id=run_id, task_id=task_id) is not None
    runs.transition(run_id, Status.RUNNING)
    runs.transition(run_id, end)


def test_grid_expands_every_combination_first_field_slowest():
    values = expand.grid({"train.lr": [0.1, 0.2], "seed": [1, 2, 3]})
    assert values == [{"train.lr": lr, "seed": s} for lr in (0.1, 0.2) for s in (1, 2, 3)]


def test_random_draws_are_seeded_and_inside_their_ranges():
    params = {"train.lr": {"low": 1e-5, "high": 1e-2, "log": True},
              "seed": {"low": 0, "high": 9, "int": True}, "scheduler.policy": ["elastic", "colocate"]}  # fmt: skip
    a = expand.random_samples(params, 20, seed=7)
    assert a == expand.random_samples(params, 20, seed=7)
    assert a != expand.random_samples(params, 20, seed=8)
    assert all(1e-5 <= v["train.lr"] <= 1e-2 for v in a)
    assert all(isinstance(v["seed"], int) and 0 <= v["seed"] <= 9 for v in a)
    assert {v["scheduler.policy"] for v in a} == {"elastic", "colocate"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"params": {"train.lr": []}}, 'params["train.lr"]'),
        ({"params": {"Bad Path": [1]}}, 'params["Bad Path"]'),
        ({"params": {"seed": list(range(9)), "steps": list(range(1, 9))}}, "params"),
        ({"mode": "random", "params": {"train.lr": {"low": 2, "high": 1}}, "samples": 3},
         'params["train.lr"]'),
        ({"mode": "random", "params": {"seed": [1]}, "samples": 0}, "samples"),
        ({"max_concurrent": 0}, "max_concurrent"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_refused_naming_the_field(people, sim_config, spec, field):
    with pytest.raises(expand.SpecInvalid) as err:
        _sweep(people, sim_config, **spec)
    assert field in dict(err.value.errors)
    assert not Run.objects.exists() and not Sweep.objects.exists()


def test_a_generated_config_the_validator_refuses_names_the_swept_field(people, sim_config):
    with pytest.raises(expand.SpecInvalid) as err:
        _sweep(people, sim_config, params={"train.lr": [0.001, -1.0], "seed": [1, 2]})
    errors = dict(err.value.errors)
    assert list(errors) == ['params["train.lr"]'] and "-1.0" in errors['params["train.lr"]']
    with pytest.raises(expand.SpecInvalid) as err:
        _sweep(people, sim_config, params={"train.no_such": [1]})
    assert 'params["train.no_such"]' in dict(err.value.errors)
    assert not Run.objects.exists() and not Sweep.objects.exists()  # every config checked first


def test_the_cap_holds_while_workers_end_runs_and_every_run_is_launched_once(people, sim_config):
    sweep = _sweep(people, sim_config, params={"seed": [1, 2, 3, 4, 5], "train.lr": [1e-4]})
    assert sweep.sweep_runs.count() == 5
    seen_max = 0
    endings = [
        Status.SUCCEEDED,
        Status.FAILED,
        Status.SUCCEEDED,
        Status.CANCELLED,
        Status.SUCCEEDED,
    ]
    for end in endings:
        started = _started_active(sweep)
        seen_max = max(seen_max, len(started))
        assert 1 <= len(started) <= 2
        if end == Status.CANCELLED:  # cancelled while queued: it ends at once
            runs.request_stop(run=Run.objects.get(pk=started[0]), mode="cancel")
        else:
            _work(started[0], end)
    assert seen_max == 2
    assert set(Run.objects.filter(sweep_run__sweep=sweep).values_list("status", flat=True)) <= set(
        ENDED
    )
    for run in Run.objects.filter(sweep_run__sweep=sweep):  # launched exactly once
        assert LaunchOutbox.objects.filter(run=run).count() == 1
    assert services.advance(sweep.pk) == []  # idempotent: nothing left to launch


def test_the_sweeps_runs_carry_their_values_and_the_base_config(people, sim_config):
    sweep = _sweep(people, sim_config, params={"train.lr": [1e-4, 3e-4], "seed": [5]})
    rows = sweep.sweep_runs.select_related("run").order_by("index")
    assert [r.values for r in rows] == [
        {"train.lr": 1e-4, "seed": 5},
        {"train.lr": 3e-4, "seed": 5},
    ]
    assert [r.run.config["train"]["lr"] for r in rows] == [1e-4, 3e-4]
    assert all(r.run.seed == 5 and r.run.config["sim"]["rollouts"] == 32 for r in rows)


def test_cancel_stops_pending_and_running_runs_and_launches_nothing_more(people, sim_config):
    sweep = _sweep(people, sim_config)
    first, _second = _started_active(sweep)
    task = Run.objects.get(pk=first).celery_task_id
    runs.claim_launch(run_id=first, task_id=task)
    runs.transition(first, Status.RUNNING)
    services.cancel_sweep(sweep=sweep)
    statuses = dict(Run.objects.filter(sweep_run__sweep=sweep).values_list("pk", "status"))
    assert statuses.pop(first) == Status.RUNNING  # asked to stop at its next poll
    assert Run.objects.get(pk=first).stop_requested == "cancel"
    assert set(statuses.values()) == {Status.CANCELLED}
    runs.transition(first, Status.CANCELLED)  # its worker stops it
    assert LaunchOutbox.objects.filter(run__sweep_run__sweep=sweep).count() == 2
    assert services.advance_due() == 0


def _end_at_once(run_ids: list[int]) -> None:
    barrier = threading.Barrier(len(run_ids))
    errors: list[BaseException] = []

    def end(run_id: int) -> None:
        try:
            barrier.wait()
            runs.transition(run_id, Status.SUCCEEDED)
        except BaseException as err:  # reported below
            errors.append(err)
        finally:
            connection.close()

    threads = [threading.Thread(target=end, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.django_db(transaction=True)
def test_runs_ending_at_once_in_concurrent_transactions_never_pass_the_cap(people, sim_config):
    sweep = _sweep(people, sim_config, params={"seed": list(range(1, 10))}, max_concurrent=3)
    while True:
        started = _started_active(sweep)
        assert len(started) <= 3
        if not started:
            break
        for run_id in started:
            task = Run.objects.get(pk=run_id).celery_task_id
            runs.claim_launch(run_id=run_id, task_id=task)
            runs.transition(run_id, Status.RUNNING)
        _end_at_once(started)
    assert list(
        Run.objects.filter(sweep_run__sweep=sweep).values_list("status", flat=True).distinct()
    ) == [Status.SUCCEEDED]
    assert LaunchOutbox.objects.filter(run__sweep_run__sweep=sweep).count() == 9


def test_the_api_launches_lists_reads_and_cancels_a_sweep(people, sim_config, client_for):
    exp = runs.create_experiment(team=people["team"], name="api sweeps")
    body = {"experiment": exp.pk, "name": "lr", "base_config": sim_config, "mode": "grid",
            "params": {"train.lr": [1e-4, 3e-4], "seed": [1, 2]}, "max_concurrent": 2}  # fmt: skip
    assert client_for(people["viewer"]).post("/api/sweeps/", body, format="json").status_code == 403
    bad = client_for(people["member"]).post(
        "/api/sweeps/", {**body, "params": {"train.lr": [0.001, -1]}}, format="json"
    )
    assert bad.status_code == 400 and 'params["train.lr"]' in bad.json()
    bad = client_for(people["member"]).post(
        "/api/sweeps/", {**body, "base_config": {**sim_config, "steps": -1}}, format="json"
    )
    assert bad.status_code == 400 and "steps" in bad.json()["base_config"]
    made = client_for(people["member"]).post("/api/sweeps/", body, format="json")
    assert made.status_code == 201, made.content
    sweep = made.json()
    assert sweep["status"] == "running" and sweep["run_count"] == 4
    assert [r["launched"] for r in sweep["runs"]] == [True, True, False, False]  # the cap: 2
    assert [r["values"] for r in sweep["runs"]][:2] == [
        {"train.lr": 1e-4, "seed": 1}, {"train.lr": 1e-4, "seed": 2}
    ]  # fmt: skip
    first = sweep["runs"][0]["run"]
    runs.append_events(run_id=first, events=[
        {"kind": "step_finished", "t": 1.0, "data": {"step": 2, "version": 2, "metrics": {"loss": 0.25}}},
        {"kind": "benchmark", "t": 1.0, "data": {"step": 1, "suite": "repo", "score": 0.1}},
        {"kind": "benchmark", "t": 2.0, "data": {"step": 2, "suite": "repo", "score": 0.5}},
        {"kind": "benchmark", "t": 2.0, "data": {"step": 2, "suite": "math", "score": 0.7}},
    ])  # fmt: skip
    listed = client_for(people["viewer"]).get(f"/api/sweeps/?experiment={exp.pk}").json()
    assert [s["id"] for s in listed["results"]] == [sweep["id"]]
    assert client_for(people["outsider"]).get(f"/api/sweeps/{sweep['id']}/").status_code == 404
    row = client_for(people["viewer"]).get(f"/api/sweeps/{sweep['id']}/").json()["runs"][0]
    assert row["benchmark_step"] == 2 and row["benchmark"] == {"repo": 0.5, "math": 0.7}
    assert row["score"] == pytest.approx(0.6) and row["metrics"] == {"loss": 0.25}
    url = f"/api/sweeps/{sweep['id']}/cancel/"
    assert client_for(people["viewer"]).post(url).status_code == 403
    done = client_for(people["member"]).post(url)
    assert done.status_code == 200 and done.json()["status"] == "cancelled"
    assert {r["status"] for r in done.json()["runs"]} == {"cancelled"}


def test_a_run_whose_worker_died_and_cannot_resume_hands_its_slot_on(people, sim_config, settings):
    """The reaper fails a run with no resume left: its ending launches the next run, in the
    reaper's transaction; the catch-up then finds nothing to do."""
    settings.GYRE_REAPER_MAX_RESUMES = 0
    sweep = _sweep(people, sim_config, params={"seed": [1, 2, 3]}, max_concurrent=1)
    (first,) = _started_active(sweep)
    runs.claim_launch(run_id=first, task_id=Run.objects.get(pk=first).celery_task_id)
    runs.transition(first, Status.RUNNING)
    Run.objects.filter(pk=first).update(heartbeat_at=None)  # its worker is gone
    assert runs.reap_stale_runs() == [first]
    assert Run.objects.get(pk=first).status == Status.FAILED
    (second,) = _started_active(sweep)
    assert second != first and services.advance_due() == 0
    assert _started_active(sweep) == [second]


def test_a_random_sweep_stores_its_seeded_draws_in_its_runs(people, sim_config):
    params = {"train.lr": {"low": 1e-5, "high": 1e-3, "log": True}, "seed": [3, 4]}
    sweep = _sweep(people, sim_config, mode="random", params=params, samples=5, seed=11)
    rows = sweep.sweep_runs.select_related("run").order_by("index")
    assert [r.values for r in rows] == expand.random_samples(params, 5, seed=11)
    assert [r.run.config["train"]["lr"] for r in rows] == [r.values["train.lr"] for r in rows]
    assert (sweep.samples, sweep.seed, len(_started_active(sweep))) == (5, 11, 2)
