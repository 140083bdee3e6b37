"""What other apps do when a run ends, without the runs app importing them: receivers
registered in their AppConfig.ready (sweeps, alerts) and called by
``lifecycle.transition`` in its transaction, in the order they were registered.

``on_run_ended``: the run succeeded, failed or was cancelled (alerts queue their
deliveries). ``on_run_left_active``: the run is no longer queued, starting or running,
ended or paused (a sweep's next run takes its slot)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Receiver = Callable[[Any], object]
_ended: list[Receiver] = []
_left_active: list[Receiver] = []


def _register(receivers: list[Receiver], receiver: Receiver) -> Receiver:
    if receiver not in receivers:  # ready() may run twice (tests): once each
        receivers.append(receiver)
    return receiver


def on_run_ended(receiver: Receiver) -> Receiver:
    return _register(_ended, receiver)


def on_run_left_active(receiver: Receiver) -> Receiver:
    return _register(_left_active, receiver)


def run_ended(run: Any) -> None:
    for receiver in list(_ended):
        receiver(run)


def run_left_active(run: Any) -> None:
    for receiver in list(_left_active):
        receiver(run)
