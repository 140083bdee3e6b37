"""A sink that fails mid-run (as the worker's did on a NUL it could not store) fails the
run with a one-line reason and still shuts everything down: the unit actors, the sink's
thread and the Ray cluster the run started. No ``ray_cluster`` fixture here: the run
starts its own Ray, so that its shutdown can be checked."""

import threading

import pytest
import ray

from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from gyre_core.runtime.threaded_sink import SinkFailed
from tests.runtime.conftest import tiny_job

pytestmark = pytest.mark.slow


class FailingSink:
    """Records every event and raises on the first of kind ``on``, as a database would."""

    def __init__(self, on: str) -> None:
        self.on, self.sink, self.failed = on, ListSink(), False

    def emit(self, e) -> None:
        if e.kind == self.on and not self.failed:
            self.failed = True
            raise ValueError("PostgreSQL text fields cannot contain NUL (0x00) bytes\nDETAIL: x")
        self.sink.emit(e)


def test_a_failing_sink_fails_the_run_and_shuts_ray_down(tmp_path) -> None:
    assert not ray.is_initialized()
    job = tiny_job("elastic")
    job["cluster"] = {"units": 2}
    sink = FailingSink(on="rollout_started")
    with pytest.raises(SinkFailed) as failed:
        run_job(RunConfig.from_dict(job), sink=sink, workdir=tmp_path)
    reason = "event sink failed: ValueError: PostgreSQL text fields cannot contain NUL"
    assert str(failed.value).startswith(reason) and "\n" not in str(failed.value)
    last = sink.sink.events[-1]  # the run's final status names the reason, in one line
    assert (last.kind, last.status) == ("run_status", "failed")
    assert last.message == f"SinkFailed: {failed.value}"
    assert not ray.is_initialized(), "ray.shutdown() ran although the sink failed"
    assert not [t for t in threading.enumerate() if t.name == "gyre-sink"]
