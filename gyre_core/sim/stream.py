"""Streaming training in the simulator (``CostModel.streaming``): a step opens on the
first whole groups ready, takes the rest of its batch as groups finish (oldest version
first, ``batching``), and its optimizer update comes once the batch is consumed; a unit
that enters training while a step is open joins it and shares the work left (the join
window closes once the whole batch is taken and trained). ``gyre_core/train/streaming.py``
is the trainer's side of the same protocol (micro-steps claimed from a counter, a
satellite joining from a snapshot)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class OpenStep:
    """A streaming step in progress: the rollouts and tokens taken so far, and when the
    training units will be done with them at their present number."""

    step: int  # the version it produces
    epoch: int  # its STEP event carries this; a join reschedules the event
    units: int  # training units working on it
    busy_until: float  # when the micro-steps taken so far are done
    taken: int = 0  # rollouts taken
    tokens: int = 0  # their tokens
    full: bool = False  # the whole batch is taken: the STEP event stands

    def add(self, t: float, tokens: int, rollouts: int, unit_tok_s: float) -> None:
        """Rollouts ready at ``t`` join the step's work, after what it has in hand."""
        start = self.busy_until if self.busy_until > t else t
        self.busy_until = start + tokens / (self.units * unit_tok_s)
        self.taken += rollouts
        self.tokens += tokens

    def join(self, t: float) -> None:
        """One more unit from ``t`` on: the work left is shared by one more."""
        if self.busy_until > t:
            left = (self.busy_until - t) * self.units  # unit-seconds of training left
            self.busy_until = t + left / (self.units + 1)
        self.units += 1
