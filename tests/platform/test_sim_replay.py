"""``sim.speed``: a simulated run replayed in time through the same path (launch_run, the
DbSink, the event log), and a stop request that ends the wait at once."""

from __future__ import annotations

import time

import pytest
from gyre_web.runs import services
from gyre_web.runs.models import RunEvent, Status

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import RolloutStarted, StepFinished
from workers.sink import DbSink
from workers.tasks import launch_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def exp(people):
    return services.create_experiment(team=people["team"], name="replay")


def test_speed_is_validated_and_kept_in_the_snapshot(exp, sim_config):
    with pytest.raises(ConfigError):
        RunConfig.from_dict({**sim_config, "sim": {**sim_config["sim"], "speed": -1}})
    sim_config["sim"]["speed"] = 5
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    assert run.config["sim"]["speed"] == 5.0
    assert RunConfig.from_dict({"backend": "sim"}).sim.speed == 0.0  # as fast as possible


def test_a_paced_sink_holds_each_event_until_it_is_due(exp, sim_config):
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    sink = DbSink(run.pk, batch=1000, interval=3600, pace=20.0)  # 20 run-seconds a second
    t0 = time.monotonic()
    sink.emit(RolloutStarted(t=0.0, rollout_id="r0", task_id="t", group_id="g", step=0))
    sink.emit(RolloutStarted(t=0.0, rollout_id="r1", task_id="t", group_id="g", step=0))
    assert time.monotonic() - t0 < 0.1  # nothing was due later
    sink.emit(StepFinished(t=6.0, step=1, version=1, metrics={"loss": 1.0}))  # due at 0.3 s
    assert time.monotonic() - t0 >= 0.29
    # The events before the wait were written before it, the last one is still buffered.
    assert list(RunEvent.objects.filter(run=run).values_list("seq", flat=True)) == [1, 2, 3]
    sink.flush()
    assert RunEvent.objects.filter(run=run).count() == 3


def test_a_stop_request_ends_the_wait(exp, sim_config):
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    sink = DbSink(run.pk, pace=1.0, stop=lambda: True)
    t0 = time.monotonic()
    sink.emit(RolloutStarted(t=0.0, rollout_id="r0", task_id="t", group_id="g", step=0))
    sink.emit(RolloutStarted(t=3600.0, rollout_id="r1", task_id="t", group_id="g", step=0))
    assert time.monotonic() - t0 < 1.0
    assert sink.pace == 0.0  # the rest goes through at full speed


def _launch(exp, config) -> tuple[float, list[tuple[int, str, float]]]:
    run = services.create_run(experiment=exp, config=config, launch=False)
    t0 = time.monotonic()
    launch_run.apply(args=[run.pk])  # the task's body, in this process
    took = time.monotonic() - t0
    run.refresh_from_db()
    assert run.status == Status.SUCCEEDED, run.error
    rows = RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "t")
    return took, list(rows)


def test_launch_run_replays_a_sim_run_at_the_configured_speed(exp, sim_config):
    fast, events = _launch(exp, sim_config)
    span = max(t for _, _, t in events)  # the run's simulated length in seconds
    assert span > 0
    sim_config["sim"]["speed"] = span / 1.5  # replay it in about 1.5 wall seconds
    slow, replayed = _launch(exp, sim_config)
    assert slow >= 1.4 and slow > fast
    # The same events in the same order; only the wall clock differs.
    assert [(s, k) for s, k, _ in replayed] == [(s, k) for s, k, _ in events]
