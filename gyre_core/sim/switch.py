"""The role-switch protocol and the GPU-time accounts of the simulator's units.

rollout -> train: the router stops sending the unit new calls; its in-flight calls may
finish until the drain deadline (``drain_s``); what is still running then moves to other
engines *with the tokens it has generated* (re-prefilled there, never restarted) — or, in
``restart`` mode, the baseline other frameworks use, is aborted and its agent session
restarted from scratch; then the trainer loads (``CostModel.switch_to("train")``).
train -> rollout: the engine starts, or wakes, with the latest weights
(``CostModel.switch_to("rollout")``).
A unit holds one role at a time; while it changes, its role is ``switching``.

:class:`Switches` holds each unit's target role, its drain state and its GPU-time account;
what happens to the sessions of a unit that stops or starts serving is the simulator's,
which it passes in as three callables.
"""

from __future__ import annotations

from collections.abc import Callable

from gyre_core import events as ev
from gyre_core.cluster import IDLE, ROLES, ROLLOUT, SWITCHING, TRAIN, Cluster
from gyre_core.sim.costs import CostModel
from gyre_core.sim.ps_queue import Engine
from gyre_core.sim.queue import DRAINED, SWITCHED, EventQueue

CATEGORIES = ("rollout_busy", "rollout_idle", "train", SWITCHING, IDLE)


class Switches:
    """Role switches of the units of ``cluster`` whose engines are ``engines`` (the list the
    simulator owns; a unit that starts serving gets a new one there).

    ``leave_rollout(u)``: unit ``u`` stops taking calls (its waiting calls and the prefix
    caches on it go); ``evict(u)``: the drain deadline, move or abort what ``u`` still runs;
    ``serve(u)``: ``u`` has loaded the rollout role, start its engine.
    """

    def __init__(
        self,
        cluster: Cluster,
        engines: list[Engine],
        costs: CostModel,
        queue: EventQueue,
        sink: ev.EventSink,
        targets: list[str],
        *,
        leave_rollout: Callable[[int], None],
        evict: Callable[[int], None],
        serve: Callable[[int], None],
    ) -> None:
        self.cluster, self.engines, self.costs = cluster, engines, costs
        self.queue, self.sink = queue, sink
        self.leave_rollout, self.evict, self.serve = leave_rollout, evict, serve
        n = len(cluster)
        self.targets = targets  # the role each unit holds or is switching to
        self.drain_epoch = [0] * n
        self.draining = [False] * n
        self.count = 0  # switches begun
        self.step_units: list[int] = []  # the units the running training step uses
        self.since = [0.0] * n  # when each unit's open interval began
        self.gpu_s: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
        self.train_busy_s = 0.0  # GPU-seconds of training units inside a step

    # ------------------------------------------------------------------ accounts

    def category(self, u: int) -> str:
        role = self.cluster.roles[u]
        if role == ROLLOUT:
            return "rollout_busy" if self.engines[u].active else "rollout_idle"
        if role == TRAIN:
            return "train"
        return SWITCHING if role == SWITCHING else IDLE

    def account(self, u: int) -> None:
        """Close unit ``u``'s open interval at the clock's time under its current category;
        call it before anything that may change the category."""
        cat = self.category(u)
        t = self.queue.t
        dt = t - self.since[u]
        g = self.costs.gpus_per_unit
        self.gpu_s[cat] += dt * g
        if cat == "train" and u in self.step_units:
            self.train_busy_s += dt * g
        self.since[u] = t

    def start_step(self, units: list[int]) -> None:
        for u in units:
            self.account(u)
        self.step_units = units

    def end_step(self) -> None:
        for u in self.step_units:
            self.account(u)
        self.step_units = []

    def close(self) -> None:
        for u in range(len(self.cluster)):
            self.account(u)

    # ------------------------------------------------------------------ protocol

    def set_role(self, u: int, role: str) -> None:
        self.account(u)
        old = self.cluster.set_role(u, role)
        self.sink.emit(
            ev.RoleChange(
                t=self.queue.t,
                unit=u,
                gpus=list(self.cluster.units[u].gpus),
                from_role=old,
                to_role=role,
            )
        )

    def begin(self, u: int, role: str) -> None:
        """A policy asks unit ``u`` to take ``role``."""
        current = self.cluster.roles[u]
        if role not in ROLES or current in (SWITCHING, role):
            return
        if current == TRAIN and u in self.step_units:
            return  # mid-step: a policy may only take a training unit between steps
        self.targets[u] = role
        self.set_role(u, SWITCHING)
        self.count += 1
        e = self.engines[u]
        t = self.queue.t
        if current == ROLLOUT:
            e.accepting = False
            self.leave_rollout(u)
            if e.active:
                self.draining[u] = True
                self.drain_epoch[u] += 1
                self.queue.push(t + self.costs.drain_s, DRAINED, u, self.drain_epoch[u])
                return
        self.queue.push(t + self.costs.switch_to(role), SWITCHED, u, ROLES.index(role))

    def drained(self, u: int) -> None:
        """A draining unit's engine is empty: load the new role."""
        if not self.draining[u]:
            return
        self.draining[u] = False
        self.drain_epoch[u] += 1  # a pending drain deadline no longer applies
        role = self.targets[u]
        self.queue.push(self.queue.t + self.costs.switch_to(role), SWITCHED, u, ROLES.index(role))

    def on_drained(self, u: int, epoch: int) -> bool:
        """The drain deadline: move (or, in restart mode, abort) what is still running."""
        if epoch != self.drain_epoch[u] or not self.draining[u]:
            return False
        self.account(u)
        self.evict(u)
        self.drained(u)
        return True

    def on_switched(self, u: int, role_index: int) -> bool:
        role = ROLES[role_index]
        self.set_role(u, role)
        self.targets[u] = role
        if role == ROLLOUT:
            self.serve(u)
        return True
