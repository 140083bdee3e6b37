"""The reporter's side with no platform to reach: every event spooled in order before it
is sent, nothing acknowledged, and a reporter started again on the folder continues the
numbering with the unsent events pending."""

from __future__ import annotations

import json
from pathlib import Path

from gyre_core.events import StepFinished
from gyre_core.runtime.report import SPOOL, STATE, Platform, Reporter

DOWN = Platform("http://127.0.0.1:9", "tok")  # a refused port: the platform is down


def _step(step: int) -> StepFinished:
    return StepFinished(t=float(step), step=step, version=step, metrics={"loss": 1.0})


def test_an_unreachable_platform_loses_nothing(tmp_path: Path) -> None:
    (tmp_path / STATE).write_text(json.dumps({"url": DOWN.url, "run": 7, "acked": 0}))
    said: list[str] = []
    reporter = Reporter(DOWN, 7, tmp_path, interval=0.05, say=said.append)
    for step in range(1, 4):
        reporter.emit(_step(step))
    assert reporter.close(wait_s=1.0) == 3  # none acknowledged
    assert any("platform unreachable" in line for line in said)
    spooled = [json.loads(x) for x in (tmp_path / SPOOL).read_text().splitlines()]
    assert [(e["seq"], e["kind"], e["data"]["step"]) for e in spooled] == [
        (1, "step_finished", 1), (2, "step_finished", 2), (3, "step_finished", 3),
    ]  # fmt: skip
    again = Reporter(DOWN, 7, tmp_path, interval=60.0)
    again.emit(_step(4))
    assert [e["seq"] for e in again.pending] == [1, 2, 3, 4]
    assert again.close(wait_s=0.5) == 4
    assert json.loads((tmp_path / STATE).read_text())["acked"] == 0
