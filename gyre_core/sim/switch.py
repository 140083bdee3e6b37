"""The role-switch protocol and the GPU-time accounts, shared by the simulator's units.

rollout -> train: the router stops sending the unit new calls; its in-flight calls may
finish until the drain deadline (``drain_s``); what is still running then moves to other
engines *with the tokens it has generated* (re-prefilled there, never restarted) — or, in
``restart`` mode, the baseline other frameworks use, is aborted and its agent session
restarted from scratch; then the trainer loads (``CostModel.switch_to("train")``).
train -> rollout: the engine starts, or wakes, with the latest weights
(``CostModel.switch_to("rollout")``).
A unit holds one role at a time; while it changes, its role is ``switching``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gyre_core import events as ev
from gyre_core.cluster import IDLE, ROLES, ROLLOUT, SWITCHING, TRAIN
from gyre_core.sim.ps_queue import Call, Engine

if TYPE_CHECKING:
    from gyre_core.sim.simulator import Simulator

DRAINED, SWITCHED = 4, 3  # the simulator's event kinds (kept in sync with simulator.py)


def category(sim: Simulator, u: int) -> str:
    role = sim.cluster.roles[u]
    if role == ROLLOUT:
        return "rollout_busy" if sim.engines[u].active else "rollout_idle"
    if role == TRAIN:
        return "train"
    return SWITCHING if role == SWITCHING else IDLE


def account(sim: Simulator, u: int) -> None:
    """Close unit ``u``'s open interval at ``sim.t`` under its current category; call it
    before anything that may change the category."""
    cat = category(sim, u)
    dt = sim.t - sim.since[u]
    g = sim.costs.gpus_per_unit
    sim.gpu_s[cat] += dt * g
    if cat == "train" and sim.training and u in sim.step_units:
        sim.train_busy_s += dt * g
    sim.since[u] = sim.t


def set_role(sim: Simulator, u: int, role: str) -> None:
    account(sim, u)
    old = sim.cluster.set_role(u, role)
    sim.sink.emit(
        ev.RoleChange(
            t=sim.t, unit=u, gpus=list(sim.cluster.units[u].gpus), from_role=old, to_role=role
        )
    )


def begin_switch(sim: Simulator, u: int, role: str) -> None:
    current = sim.cluster.roles[u]
    if role not in ROLES or current in (SWITCHING, role):
        return
    if current == TRAIN and sim.training and u in sim.step_units:
        return  # mid-step: a policy may only take a training unit between steps
    sim.targets[u] = role
    set_role(sim, u, SWITCHING)
    sim.stats.role_switches += 1
    e = sim.engines[u]
    if current == ROLLOUT:
        e.accepting = False
        sim.leave_rollout(u)
        for s in sim.sessions:  # its prefix cache goes with it
            if s.unit == u and s.call is None:
                sim.set_unit(s, -1)
        if e.active:
            sim.draining[u] = True
            sim.drain_epoch[u] += 1
            sim.push(sim.t + sim.costs.drain_s, DRAINED, u, sim.drain_epoch[u])
            return
    sim.push(sim.t + sim.costs.switch_to(role), SWITCHED, u, ROLES.index(role))


def drained(sim: Simulator, u: int) -> None:
    """A draining unit's engine is empty: load the new role."""
    if not sim.draining[u]:
        return
    sim.draining[u] = False
    sim.drain_epoch[u] += 1  # a pending drain deadline no longer applies
    role = sim.targets[u]
    sim.push(sim.t + sim.costs.switch_to(role), SWITCHED, u, ROLES.index(role))


def on_drained(sim: Simulator, u: int, epoch: int) -> bool:
    """The drain deadline: move (or, in restart mode, abort) what is still running."""
    if epoch != sim.drain_epoch[u] or not sim.draining[u]:
        return False
    e = sim.engines[u]
    account(sim, u)
    for call in list(e.active.values()):
        s = sim.sessions[call.rollout]
        decoded = e.remove(call, sim.t)
        if sim.mode == "migrate":
            s.versions[e.version] += decoded - call.done
            s.context += decoded
            s.tokens += decoded
            sim.stats.calls_migrated += 1
            sim.stats.tokens_reprefilled += s.context
            sim.set_unit(s, -1)
            s.call = None
            sim.sink.emit(
                ev.CallMigrated(
                    t=sim.t,
                    rollout_id=s.trace.rollout_id,
                    from_unit=u,
                    to_unit=-1,
                    tokens_kept=decoded,
                )
            )
            sim.route(s, Call(call.rollout, call.completion - decoded, 0.0), fresh=s.context)
        else:
            sim.restart(s, discarded=sum(s.versions.values()) + decoded)
    drained(sim, u)
    return True


def on_switched(sim: Simulator, u: int, role_index: int) -> bool:
    role = ROLES[role_index]
    set_role(sim, u, role)
    sim.targets[u] = role
    if role == ROLLOUT:
        # A new engine; its epochs continue the old one's so that no stale event matches.
        old = sim.engines[u].epoch
        e = Engine(
            u, sim.costs, version=sim.version, t_last=sim.t, paused_until=sim.t, epoch=old + 1
        )
        sim.engines[u] = e
        sim.fill(e)
        sim.schedule(e)
    return True


def close_accounts(sim: Simulator) -> None:
    for u in range(len(sim.cluster)):
        account(sim, u)


def empty_accounts() -> dict[str, float]:
    return dict.fromkeys(("rollout_busy", "rollout_idle", "train", SWITCHING, IDLE), 0.0)
