"""The control loop of a real run: the policy decides, this loop carries it out.

Every ``TICK_S`` the loop builds a :class:`Snapshot` of the real state (unit roles, calls
per engine, sessions, ready rollouts, version), asks the policy, and acts:

* **admit**: start that many agent sessions (asyncio tasks in this process; each LLM call
  goes through the router to whichever unit serves it);
* **targets**: switch units through the protocol of DESIGN.md — rollout → train: the router
  stops sending the unit calls and drains it (calls still running at the deadline move to
  other engines with their tokens), the engine is freed, the trainer replica loads;
  the unit joins the training group (its processes receive the state from a peer unit);
  train → rollout: the unit leaves the group (the last one out offloads the state), an
  engine starts with the newest weights;
* **start_step**: one training step of the training group (the units in the train role,
  :mod:`~gyre_core.runtime.train_group`) — the driver packs the batch and splits its
  samples by tokens over the group's processes, which hold the sharded weights and
  optimizer state and reduce their gradients among themselves; the new weights, gathered
  by the group into Ray's object store, are published to every engine (with
  ``engine.weight_sync: nccl``, broadcast to them over NCCL:
  :mod:`~gyre_core.runtime.nccl_publish`). The driver holds no model.

Sessions never live on a unit, so a switch restarts none of them (``restart`` switch mode
exists as the baseline that does).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from gyre_core import events as ev
from gyre_core.cluster import IDLE, ROLLOUT, SWITCHING, TRAIN
from gyre_core.rollout.router import Router
from gyre_core.runtime import batches
from gyre_core.runtime.inventory import read_inventory
from gyre_core.runtime.nccl_publish import NcclPublisher
from gyre_core.runtime.plan import RunPlan
from gyre_core.runtime.ray_backend import UnitEngine
from gyre_core.runtime.stream_group import prefix_targets
from gyre_core.runtime.train_group import TrainGroup, UnitsLost
from gyre_core.scheduler.base import FinishRate, Policy, Snapshot
from gyre_core.trajectory.failures import step_figures
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.paths import path_figures
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.tree import PrefixTree

TICK_S = 0.05
STOP_CHECK_S = 0.25
ENGINE_START = "engine start"  # the phase_progress name of bringing the engines up
MAX_SEQS = 16  # an engine's batch cap unless its settings give one (Loop.max_seqs)


class PublishError(RuntimeError):
    """A live rollout engine did not take a step's weights: the step, and the run, fail."""


@dataclass
class UnitSlot:
    id: int
    actor: Any
    role: str
    target: str
    busy: bool = False  # a switch is in progress
    dead: bool = False
    node: str = ""  # the Ray node id the unit's actor runs on
    procs: list[Any] = field(default_factory=list)  # its processes' actors (actor first)
    placement: Any = None  # the Ray placement group holding its processes together

    def __post_init__(self) -> None:
        if not self.procs:
            self.procs = [self.actor]

    @property
    def name(self) -> str:
        return f"unit-{self.id}"


@dataclass
class Counters:
    role_switches: int = 0
    switch_s: list[float] = field(default_factory=list)
    switch_parts: list[dict[str, float]] = field(default_factory=list)  # each switch's parts
    switch_to: list[str] = field(default_factory=list)  # each switch's new role
    weight_sync_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)
    tokens_trained: int = 0
    tokens_per_call: int = 0
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    # per step, on the run clock: (start, end incl. publication and checkpoint, train units)
    step_spans: list[tuple[float, float, int]] = field(default_factory=list)


# Called after each step with its batch, its metrics and the trees it trained on (weighed).
OnStep = Callable[[list[Rollout], dict[str, Any], dict[str, PrefixTree]], Awaitable[None]]
# A step's off-policy rollouts by the version it trains: as trained, as recorded.
Imported = Callable[[int], tuple[list[Rollout], list[Rollout]]]


@dataclass
class LoopStart:
    """What a loop starts from: rollouts finished but not trained yet and the session
    indices still to run (a resumed run's; ``None``: every session of the run), the
    weights the engines start from in Ray's object store (``None``: the checkpoint's), and
    the run's off-policy data, when it imports some. ``first_new``: the index the first
    session started in place of a dropped group takes (0: the run's total; a resumed run's
    is past every index it already ran, so no rollout id repeats)."""

    ready: list[Rollout] = field(default_factory=list)
    pending: list[int] | None = None
    first_new: int = 0
    state_ref: Any = None
    imported: Imported | None = None


class StepDropped(Exception):
    """A streaming step left open when the run ended (its groups will not come)."""


class Loop:
    """One run's state and the actions the policy asks for (see the module docstring).
    ``plan`` holds every value the loop takes from the run's config."""

    def __init__(
        self,
        plan: RunPlan,
        *,
        policy: Policy,
        units: list[UnitSlot],
        router: Router,
        trainer: TrainGroup,
        sink: ev.EventSink,
        clock: Callable[[], float],
        start_session: Callable[[int], Any],
        on_step: OnStep,
        start: LoopStart | None = None,
    ) -> None:
        start = start or LoopStart()
        self.plan, self.policy, self.units, self.router = plan, policy, units, router
        self.trainer, self.sink, self.clock = trainer, sink, clock
        self.start_session, self.on_step = start_session, on_step
        self.total, self.per_step, self.steps = plan.total, plan.per_step, plan.steps
        self.ready: list[Rollout] = list(start.ready)
        self.finishes = FinishRate()  # the recent finish rate the policy predicts batches from
        self.pending: list[int] = list(
            range(self.total) if start.pending is None else start.pending
        )
        self.sessions: dict[int, asyncio.Task[Rollout]] = {}
        self.training = False
        self.stopping = False  # the run is over (settle): an open streaming step is dropped
        self.step_units: set[int] = set()  # units computing the running step's gradients
        self.counters = Counters()
        self.max_seqs = MAX_SEQS  # a unit engine's batch cap: the policy sizes rollout by it
        self.state_ref: Any = start.state_ref  # the newest weights in Ray's object store
        # (None: the checkpoint's), made by the training group, never fetched into this process
        self.errors: list[BaseException] = []
        self.background: set[asyncio.Task[Any]] = set()
        self.imported = start.imported
        self.groups_dropped = 0  # stale groups dropped since the last step (batching.py)
        self.replaced = 0  # sessions started in place of dropped ones
        # the first replacement's index, on a group's first index (whole groups again)
        size = plan.config.rollout.group_size
        self.first_new = -(-max(self.total, start.first_new) // size) * size
        # the version the rollout engines serve: a step's version counts for admission only
        # once its weights are published (the trainer's runs ahead while they go out)
        self.published = trainer.version
        # engine.weight_sync nccl: a step's weights go from the trainer to the engines over
        # NCCL (runtime/nccl_publish.py); otherwise through Ray's object store
        engine = trainer.cfg.engine
        self.nccl = (
            NcclPublisher(trainer, engine.bucket_mb * 1024 * 1024)
            if engine.weight_sync == "nccl"
            else None
        )

    # ------------------------------------------------------------------ the loop

    async def run(self, should_stop: Callable[[], bool]) -> None:
        next_check = 0.0
        while self.trainer.version < self.steps:
            if self.errors:
                raise self.errors[0]
            if time.monotonic() >= next_check:  # should_stop may query a database: off-loop
                next_check = time.monotonic() + STOP_CHECK_S
                if await asyncio.to_thread(should_stop):
                    return
            self._reap()
            live = [s for s in self.units if not s.dead]  # lost units leave the pool
            decision = self.policy.decide(self.snapshot(live))
            targets = decision.targets
            if self.plan.config.scheduler.streaming:  # the training units: a prefix of ranks
                targets = prefix_targets(targets, [s.target for s in live])
            for u, role in targets.items():
                slot = live[u]
                # A step's replica is never taken mid-step (nor is it in the simulator).
                if slot.dead or slot.busy or slot.target == role or slot.id in self.step_units:
                    continue
                self._spawn(self._switch(slot, role))
            for _ in range(min(decision.admit, len(self.pending))):
                idx = self.pending.pop(0)
                self.sessions[idx] = asyncio.ensure_future(self.start_session(idx))
            if not decision.start_step:  # a starting step takes every unit in train
                self._ensure_rollout()
            if decision.start_step and not self.training:
                self.training = True
                self._spawn(self._train_step())
            await asyncio.sleep(TICK_S)

    def _ensure_rollout(self) -> None:
        """Units can die: if no live unit serves (or is becoming) rollout while sessions
        need one, bring back a training unit that no step is using."""
        if not (self.sessions or self.pending):
            return
        if any(not s.dead and s.target == ROLLOUT for s in self.units):
            return
        for s in self.units:
            if not s.dead and not s.busy and s.role == TRAIN and s.id not in self.step_units:
                self._spawn(self._switch(s, ROLLOUT))
                return

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self.background.discard(t)
            if not t.cancelled() and not isinstance(t.exception(), StepDropped | None):
                self.errors.append(t.exception())  # type: ignore[arg-type]

        task.add_done_callback(done)

    def _reap(self) -> None:
        for idx, task in list(self.sessions.items()):
            if task.done():
                del self.sessions[idx]
                self.ready.append(task.result())
                self.finishes.observe(self.clock(), _tokens(self.ready[-1]), self._usable_now())
        self._drop_stale()

    def snapshot(self, live: list[UnitSlot]) -> Snapshot:
        calls = self.router.calls_by_engine()
        pinned = self.router.sessions_by_engine()
        started = self.total - len(self.pending)
        usable = [self.ready[p] for p in self._usable()]
        return Snapshot(
            t=self.clock(),
            roles=tuple(s.role for s in live),
            targets=tuple(s.target for s in live),
            loads=tuple(calls.get(s.name, 0) for s in live),
            affinity=tuple(pinned.get(s.name, 0) for s in live),
            queued_calls=0,
            active_sessions=len(self.sessions),
            calls_in_flight=sum(calls.values()),
            ready=len(usable),
            ready_tokens=sum(_tokens(r) for r in usable),
            started=started - (self.total - self.steps * self.per_step),
            remaining=len(self.pending),
            version=self.published,
            steps_total=self.steps,
            training=self.training,
            rollouts_per_step=self.per_step,
            staleness=self.plan.staleness,
            admit_staleness=self.plan.admit_staleness,
            max_active=self.plan.max_active,
            burst_steps=self.plan.burst_steps,
            streaming=self.plan.config.scheduler.streaming,
            max_seqs_per_unit=self.max_seqs,
            switch_s=_mean(self.counters.switch_s, 1.0),
            train_tok_s=_rate(self.counters),
            finish_rate=self.finishes.rate(self.clock()),
            mean_rollout_tokens=self.finishes.mean_tokens,
            drain_s=self.plan.drain_s,
        )

    def _usable_now(self) -> int:
        """The rollouts the one just finished makes trainable: its whole group once the
        group is complete (whole-group arrival), else itself."""
        if not batches.grouped(self.plan):
            return 1
        size = self.plan.config.rollout.group_size
        g = batches.rollout_index(self.ready[-1]) // size
        mates = sum(1 for r in self.ready if batches.rollout_index(r) // size == g)
        return size if mates == size else 0

    def _usable(self) -> list[int]:
        """Positions in ``ready`` in the order the next steps train them (batching.py)."""
        return batches.select(self.ready, self.plan, self.trainer.version).usable

    def _drop_stale(self) -> None:
        """Complete groups every token of which is past the staleness bound leave ``ready``
        untrained (counted for the next step's ``groups_dropped_stale``); as many new
        sessions, whole groups again, take their place so that the run fills its steps."""
        stale = set(batches.select(self.ready, self.plan, self.trainer.version).stale)
        if not stale:
            return
        self.ready = [r for p, r in enumerate(self.ready) if p not in stale]
        self.groups_dropped += len(stale) // self.plan.config.rollout.group_size
        fresh = self.first_new + self.replaced  # new indices: whole groups past the run's own
        self.pending += range(fresh, fresh + len(stale))
        self.replaced += len(stale)

    # ------------------------------------------------------------------ role switches

    async def bring_up(self, roles: Sequence[str]) -> None:
        """Bring every unit up in its initial role (``roles``, one per unit): each loads an
        engine with the current weights and its lane starts with a rollout event, then the
        units whose initial role is training switch to it. ``phase_progress`` events
        ("engine start") count the engines up (a vLLM server takes a while)."""
        started = 0

        def report() -> None:
            self.sink.emit(
                ev.PhaseProgress(
                    t=self.clock(), phase=ENGINE_START, done=started, total=len(self.units)
                )
            )

        async def start(slot: UnitSlot) -> None:
            nonlocal started
            await self.start_engine(slot)
            started += 1
            report()

        report()
        await asyncio.gather(*(start(s) for s in self.units))
        for s in self.units:
            self._role(s, ROLLOUT)
        if self.plan.config.scheduler.streaming:  # the training units: a prefix of ranks
            moved = prefix_targets(dict(enumerate(roles)), [ROLLOUT] * len(roles))
            roles = [moved.get(u, ROLLOUT) for u in range(len(roles))]
        for slot, role in zip(self.units, roles, strict=True):
            slot.target = role
        await asyncio.gather(*(self._switch(s, TRAIN) for s in self.units if s.target == TRAIN))

    async def ensure_engine(self) -> None:
        """When no live unit serves rollout (a benchmark after the loop needs one), switch
        the first live unit back to it (the next one if that unit is lost on the way)."""
        for s in self.units:
            if not any(x.role == ROLLOUT and not x.dead for x in self.units) and not s.dead:
                await self._switch(s, ROLLOUT)

    async def _switch(self, slot: UnitSlot, to: str) -> None:
        slot.busy, slot.target, before = True, to, slot.role
        t0 = time.perf_counter()
        self._role(slot, SWITCHING)
        parts: dict[str, float] = {}
        try:
            if before == ROLLOUT:
                t = time.perf_counter()
                await self.router.drain(slot.name, self.plan.drain_s)
                self.router.remove(slot.name)
                parts["drain_s"] = time.perf_counter() - t
                parts.update(await slot.actor.stop_engine.remote())
            elif before == TRAIN:
                parts.update(await self.trainer.leave(slot))
            if to == TRAIN:
                parts.update(await self.trainer.join(slot))
            elif to == ROLLOUT:
                parts.update(await self.start_engine(slot))
        except ray.exceptions.RayActorError:
            self._lose(slot)
            return
        finally:
            slot.busy = False
        self.counters.switch_s.append(time.perf_counter() - t0)
        self.counters.switch_parts.append(parts)
        self.counters.switch_to.append(to)
        self.counters.role_switches += 1
        self._role(slot, to, {k: round(v, 4) for k, v in parts.items()})

    async def start_engine(self, slot: UnitSlot) -> dict[str, float]:
        """Start (or wake) the unit's engine on the current weights; the parts the unit
        timed, ``engine_call_other_s`` (the rest of the call: Ray's, the weights read from
        the object store) and ``publish_s`` (a step published while the engine loaded)."""
        version = self.trainer.version
        t = time.perf_counter()
        parts: dict[str, float] = await slot.actor.start_engine.remote(
            self.state_ref, version, self.max_seqs
        )
        parts["engine_call_other_s"] = max(0.0, time.perf_counter() - t - sum(parts.values()))
        engine = UnitEngine(slot.actor, version)
        if self.nccl is not None:  # its server joins the NCCL weight group with the next step
            self.nccl.reset()
        if self.trainer.version != version:  # a step published while the engine loaded
            t = time.perf_counter()
            await engine.publish(self.state_ref, self.trainer.version)
            parts["publish_s"] = time.perf_counter() - t
        self.router.add(slot.name, engine, domain=slot.node)
        return parts

    def _role(self, slot: UnitSlot, role: str, parts: dict[str, float] | None = None) -> None:
        if role == slot.role:
            return
        self.sink.emit(
            ev.RoleChange(
                t=self.clock(),
                unit=slot.id,
                gpus=[slot.id],
                from_role=slot.role,
                to_role=role,
                node=slot.node,
                parts=parts or {},
            )
        )
        slot.role = role

    def mark_dead(self, name: str) -> None:
        """A unit found dead leaves the pool. When Ray reports its node dead, the node's
        other units leave with it, before a call is sent to one of them."""
        hit = [s for s in self.units if s.name == name and not s.dead]
        lost = {s.node for s in hit if s.node and not node_alive(s.node)}
        peers = [s for s in self.units if s.node in lost and not s.dead and s not in hit]
        for slot in hit + peers:
            self._lose(slot)
        for slot in peers:
            self.router.mark_dead(slot.name)

    def _lose(self, slot: UnitSlot) -> None:
        slot.dead = True
        self._role(slot, IDLE)

    # ------------------------------------------------------------------ training

    async def _train_step(self) -> None:
        started = self.clock()
        try:
            version = self.trainer.version
            self._drop_stale()
            picked = self._usable()[: self.per_step]
            streams = self.plan.config.scheduler.streaming  # a step opens on whole groups
            if not picked or (len(picked) < self.per_step and not streams):
                return  # the policy starts a step only on a full batch (streaming: a group)
            own, chosen = [self.ready[p] for p in picked], set(picked)
            self.ready = [r for p, r in enumerate(self.ready) if p not in chosen]
            extra, record = self.imported(version) if self.imported else ([], [])
            batch = own + extra
            t0 = time.perf_counter()
            trees = self.trainer.weigh(batch, version)  # built once: on_step reuses them
            samples = self.trainer.prepare(batch, version, trees)
            replicas = [s for s in self.units if s.role == TRAIN and not s.dead]
            self.step_units = {r.id for r in replicas}
            opened = len(own)  # the rollouts the step opened on
            try:
                if opened < self.per_step:  # the rest is fed as its groups finish
                    more = self._feed(version, own, batch, trees, samples)
                    metrics = await self.trainer.step(samples, version, more)
                else:
                    metrics = await self.trainer.step(samples, version)
            except UnitsLost as lost:
                for name in lost.names:  # its node is gone: it leaves the pool, the step
                    self.mark_dead(name)  # runs again on the units left
                self.ready = own + self.ready
                return
            width = len(self.trainer.members)
            train_s = time.perf_counter() - t0
            self.counters.train_s.append(train_s)
            self.counters.tokens_trained += int(sum(len(s) for s in samples))
            t1 = time.perf_counter()
            # what a unit's engine starts or wakes on (with weight_sync nccl, only that: the
            # step's publish broadcasts them); a skipped step sends the weights it kept, which
            # are the checkpoint's (no reference yet) when no step has trained
            if not metrics.get("skipped") or self.state_ref is None:
                self.state_ref = await self.trainer.weights()
            await self._publish()
            self.counters.weight_sync_s.append(time.perf_counter() - t1)
            metrics.update(
                train_s=train_s, dp_width=float(width), weight_sync_s=time.perf_counter() - t1
            )
            if streams:
                metrics["stream_opened_on"] = float(opened)  # rollouts of the step's batch
            metrics.update(path_figures(trees.values()))  # paths and tokens taken of stored
            metrics.update(step_figures(batch, trees, self.trainer.cfg.train.max_tokens))
            if batches.grouped(self.plan):
                metrics["groups_dropped_stale"] = float(self.groups_dropped)
                self.groups_dropped = 0
            await self.on_step(own + record, metrics, trees)
            self.counters.step_spans.append((started, self.clock(), len(replicas)))
        finally:
            self.training = False
            self.step_units = set()

    async def _feed(
        self,
        version: int,
        own: list[Rollout],
        batch: list[Rollout],
        trees: dict[str, PrefixTree],
        samples: list[PackedSample],
    ) -> AsyncIterator[list[PackedSample]]:
        """A streaming step's micro-steps after its first: the groups that become
        trainable while it runs, until its batch is whole (``own``, ``batch``, ``trees``
        and ``samples`` take them too, for the step's figures)."""
        while len(own) < self.per_step:
            await asyncio.sleep(TICK_S)
            if self.stopping:  # the run is over: no group will come, the step is dropped
                raise StepDropped("the run ended with a streaming step open")
            picked = self._usable()[: self.per_step - len(own)]
            if not picked:
                continue
            new, chosen = [self.ready[p] for p in picked], set(picked)
            self.ready = [r for p, r in enumerate(self.ready) if p not in chosen]
            more = self.trainer.weigh(new, version)
            chunk = self.trainer.prepare(new, version, more)
            own += new
            batch += new
            trees.update(more)
            samples += chunk
            yield chunk

    async def _publish(self) -> None:
        """The new weights to every live rollout unit at once. A unit whose actor died leaves
        the pool (as when a call finds it dead); any other failure (the engine refused the
        update, or serves another version than the one sent: ``VLLMEngine.update_weights``
        reads it back) fails the step: an engine left on old weights would keep serving
        them while the run counted it as current. The version counts as published only
        once every live engine took it."""
        version = self.trainer.version
        live = [s for s in self.units if s.role == ROLLOUT and not s.dead]
        if self.nccl is not None:
            try:
                results = await self.nccl.publish(live, version)
            except Exception as exc:  # the training group's side: nothing was published
                raise PublishError(f"sending version {version} over NCCL failed: {exc!r}") from exc
        else:
            results = await asyncio.gather(
                *(s.actor.publish.remote(self.state_ref, version) for s in live),
                return_exceptions=True,
            )
        failed = []
        for s, result in zip(live, results, strict=True):
            if isinstance(result, ray.exceptions.RayActorError):
                self.router.mark_dead(s.name)
                self.mark_dead(s.name)
            elif isinstance(result, BaseException):
                failed.append((s.name, result))
            else:
                engine = self.router.engine(s.name)
                if isinstance(engine, UnitEngine):
                    engine.published(version)
        if failed:
            what = "; ".join(f"{name}: {e!r}" for name, e in failed)
            raise PublishError(f"publishing version {version} failed on {what}") from failed[0][1]
        self.published = version

    async def settle(self) -> None:
        """Wait for switches in flight; cancel sessions still running (the run is over);
        a streaming step still waiting for its groups is dropped."""
        self.stopping = True
        for task in list(self.sessions.values()):
            task.cancel()
        await asyncio.gather(*self.sessions.values(), return_exceptions=True)
        self.sessions.clear()
        await asyncio.gather(*self.background, return_exceptions=True)


def _tokens(r: Rollout) -> int:
    return sum(len(c.prompt_ids) + len(c.completion_ids) for c in r.calls)


def _mean(xs: list[float], default: float) -> float:
    return sum(xs) / len(xs) if xs else default


def _rate(c: Counters) -> float:
    secs = sum(c.train_s)
    return c.tokens_trained / secs if secs > 0 else 2000.0


def node_alive(node_id: str) -> bool:
    """Whether Ray's inventory holds ``node_id`` alive (True when it cannot say)."""
    try:
        records = read_inventory()
    except Exception:  # the answer only widens a loss already seen
        return True
    return all(r.alive for r in records if r.node_id == node_id)


def role_counts(units: list[UnitSlot]) -> dict[str, int]:
    return dict(Counter(IDLE if s.dead else s.role for s in units))
