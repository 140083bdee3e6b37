"""A discrete-event simulator of a cluster running a scheduling policy on a workload trace.

The policy objects are the ones the real runtime uses (``gyre_core.scheduler``); the
simulator owns the clock and its event queue (``sim.queue``), the engines
(``sim.ps_queue``), the agent sessions (``sim.session``), the router (``sim.router``), the
role-switch protocol with the GPU-time accounts (``sim.switch``) and the trainer, and
reports the same events the runtime does (``gyre_core.events``); ``sim.summary`` makes
its results.

Staleness is per token: a token decoded under version ``v`` is trained by the step that
produces version ``s`` only if ``s - 1 - v <= staleness``; older tokens stay as context,
are masked from the loss, and are counted. Every policy consumes the same trace in the
same order and finishes the same number of steps; the makespan ends when the last step's
weights exist.
"""

from __future__ import annotations

import heapq
from typing import Any

from gyre_core import events as ev
from gyre_core.cluster import ROLLOUT, SWITCHING, TRAIN, Cluster
from gyre_core.scheduler import batching
from gyre_core.scheduler.base import Decision, FinishRate, Policy, Snapshot
from gyre_core.sim.checks import check_options, check_training_fits
from gyre_core.sim.costs import CostModel
from gyre_core.sim.ps_queue import Call, Engine
from gyre_core.sim.queue import DEADLINE, DONE, DRAINED, READY, STEP, SWITCHED, EventQueue
from gyre_core.sim.ready import Ready
from gyre_core.sim.router import Router
from gyre_core.sim.session import Session, Stats
from gyre_core.sim.stream import OpenStep
from gyre_core.sim.summary import summarize
from gyre_core.sim.switch import Switches
from gyre_core.sim.workload import TraceRollout


class Simulator:
    def __init__(
        self,
        trace: list[TraceRollout],
        costs: CostModel,
        policy: Policy,
        *,
        mode: str = "migrate",
        batch_order: str = batching.ARRIVAL,
        sink: ev.EventSink | None = None,
    ) -> None:
        check_options(mode, batch_order, costs)
        self.costs, self.policy, self.mode = costs, policy, mode
        self.batch_order = batch_order
        self.sink = sink or ev.NullSink()
        self.cluster = Cluster(costs.gpus, costs.gpus_per_unit, costs.gpus_per_node)
        self.steps_total = len(trace) // costs.rollouts_per_step
        if self.steps_total < 1:
            raise ValueError(
                f"the trace has {len(trace)} rollouts, fewer than one step of "
                f"{costs.rollouts_per_step} (--rollouts-per-step)"
            )
        self.trace = trace[: self.steps_total * costs.rollouts_per_step]
        n = len(self.cluster)
        self.engines = [Engine(u, costs) for u in range(n)]
        targets = list(policy.initial_roles(n))
        check_training_fits(costs, policy, n)
        for u, role in enumerate(targets):
            self.cluster.set_role(u, role)
        self.queue = EventQueue()
        self.switches = Switches(
            self.cluster,
            self.engines,
            costs,
            self.queue,
            self.sink,
            targets,
            leave_rollout=self.leave_rollout,
            evict=self.evict,
            serve=self.serve,
        )
        self.sessions: list[Session] = []
        self.live = 0
        self.version = 0
        self.stats = Stats()
        self.ready = Ready(self.sessions, costs, batch_order, self.stats)
        self.router = Router(
            self.cluster,
            self.engines,
            costs,
            self.queue,
            self.sessions,
            self.stats,
            self.switches.account,
        )
        self.in_flight = 0  # sessions with a call on an engine or queued at the router
        self.open: OpenStep | None = None  # a streaming step in progress
        self.step_epoch = 0
        self.finishes = FinishRate()  # the recent finish rate a policy predicts batches from
        self.makespan = 0.0

    # ------------------------------------------------------------------ event queue

    @property
    def t(self) -> float:
        return self.queue.t

    @property
    def training(self) -> bool:
        return bool(self.switches.step_units)

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.queue.push(t, kind, a, b)

    def run(self) -> dict[str, Any]:
        self.sink.emit(ev.RunStatus(t=0.0, status="running", step=0, message=self.policy.name))
        for u, role in enumerate(self.switches.targets):  # every unit's lane starts with an event
            self.sink.emit(
                ev.RoleChange(
                    t=0.0,
                    unit=u,
                    gpus=list(self.cluster.units[u].gpus),
                    from_role="idle",
                    to_role=role,
                )
            )
        self.decide()
        handlers = {
            READY: self.on_ready,
            DONE: self.on_done,
            DEADLINE: self.on_deadline,
            SWITCHED: self.switches.on_switched,
            DRAINED: self.switches.on_drained,
            STEP: self.on_step,
        }
        queue, heap, pop, events = self.queue, self.queue.heap, heapq.heappop, 0
        while heap and self.version < self.steps_total:
            t, _, kind, a, b = pop(heap)  # EventQueue.pop, inlined: once per event
            queue.t = t
            events += 1
            if handlers[kind](a, b) and self.version < self.steps_total:
                self.decide()
        self.stats.events += events
        if self.version < self.steps_total:
            raise RuntimeError(
                f"{self.policy.name}: stalled at step {self.version}/{self.steps_total} "
                f"(t={self.t:.0f}s): the policy never started the remaining steps"
            )
        self.switches.close()
        self.sink.emit(ev.RunStatus(t=self.t, status="succeeded", step=self.version, message=""))
        return self.summary()

    # ------------------------------------------------------------------ policy

    def snapshot(self) -> Snapshot:
        c = self.costs
        started = len(self.sessions) - self.stats.rollouts_dropped
        ready, ready_tokens = self.ready.usable(self.version)  # what steps can take next
        return Snapshot(
            t=self.t,
            roles=tuple(self.cluster.roles),
            targets=tuple(self.switches.targets),
            loads=tuple(
                e.load if self.cluster.roles[e.unit] in (ROLLOUT, SWITCHING) else 0
                for e in self.engines
            ),
            affinity=tuple(self.router.affinity),
            queued_calls=self.router.queued,
            active_sessions=self.live,
            calls_in_flight=self.in_flight,
            ready=ready,
            ready_tokens=ready_tokens,
            started=started,
            remaining=len(self.trace) + len(self.ready.extra) - len(self.sessions),
            version=self.version,
            steps_total=self.steps_total,
            training=self.training,
            rollouts_per_step=c.rollouts_per_step,
            staleness=c.staleness,
            max_seqs_per_unit=c.max_seqs_per_unit,
            switch_s=c.switch_to(TRAIN),  # what a policy waits for a training unit
            train_tok_s=c.train_tok_s,
            admit_staleness=c.admission_ahead,
            max_active=c.max_concurrent,
            min_train=c.min_train_units,
            burst_steps=c.burst_steps,
            streaming=bool(c.streaming),
            finish_rate=self.finishes.rate(self.t),
            mean_rollout_tokens=self.finishes.mean_tokens,
            prefill_tok_s=c.prefill_tok_s,
            drain_s=c.drain_s,
        )

    def decide(self) -> None:
        self.ready.drop_stale(self.version)
        if self.open is not None:
            self.feed_step()
        d: Decision = self.policy.decide(self.snapshot())
        for u, role in sorted(d.targets.items()):
            self.switches.begin(u, role)
        for _ in range(min(d.admit, len(self.trace) + len(self.ready.extra) - len(self.sessions))):
            self.admit()
        if d.start_step:
            self.start_step()

    # ------------------------------------------------------------------ sessions

    def admit(self) -> None:
        i = len(self.sessions)
        tr = self.trace[i] if i < len(self.trace) else self.ready.extra[i - len(self.trace)]
        s = Session(i, tr, self.t, self.t + tr.timeout_s)
        self.sessions.append(s)
        self.live += 1
        self.stats.peak_rollouts = max(self.stats.peak_rollouts, self.live)
        self.sink.emit(
            ev.RolloutStarted(
                t=self.t,
                rollout_id=tr.rollout_id,
                task_id=tr.task_id,
                group_id=tr.group_id,
                step=self.version,
            )
        )
        self.push(s.deadline, DEADLINE, i)
        self.push(self.t, READY, i)

    def on_ready(self, i: int, _: int) -> bool:
        s = self.sessions[i]
        if s.status != "running":
            return False
        turn = s.trace.turns[s.turn]
        s.context += turn.prompt_tokens
        s.tokens += turn.prompt_tokens
        self.in_flight += 1
        self.router.route(s, Call(i, turn.completion_tokens, 0.0), fresh=turn.prompt_tokens)
        return False

    def on_done(self, u: int, epoch: int) -> bool:
        e = self.engines[u]
        if epoch != e.epoch:
            return False
        e.pending = None
        self.switches.account(u)
        finished = e.pop_finished(self.t)
        changed = False
        for call in finished:
            changed |= self.complete(call, e)
        self.router.fill(e)
        self.router.schedule(e)
        if not e.accepting and not e.active:
            self.switches.drained(u)
        return changed

    def complete(self, call: Call, e: Engine) -> bool:
        s = self.sessions[call.rollout]
        s.call = None
        self.in_flight -= 1
        s.versions[e.version] += call.completion - call.done
        s.context += call.completion
        s.tokens += call.completion
        turn = s.trace.turns[s.turn]
        s.turn += 1
        if turn.compact_to is not None:
            s.context = turn.compact_to
            s.tokens += turn.compact_to  # the summary starts a new branch
        if s.turn == len(s.trace.turns):
            self.finish(s, "completed")
            return True
        self.push(self.t + turn.tool_s, READY, s.index)
        return False

    def leave_rollout(self, u: int) -> None:
        self.router.leave_rollout(u)  # the router is built after the switches it accounts to

    def evict(self, u: int) -> None:
        """Unit ``u``'s drain deadline: its running calls move to other engines with the
        tokens they have (``migrate``), or their sessions start over (``restart``)."""
        e = self.engines[u]
        for call in list(e.active.values()):
            s = self.sessions[call.rollout]
            decoded = e.remove(call, self.t)
            if self.mode == "migrate":
                s.versions[e.version] += decoded - call.done
                s.context += decoded
                s.tokens += decoded
                self.stats.calls_migrated += 1
                self.stats.tokens_reprefilled += s.context
                self.router.set_unit(s, -1)
                s.call = None
                self.sink.emit(
                    ev.CallMigrated(
                        t=self.t,
                        rollout_id=s.trace.rollout_id,
                        from_unit=u,
                        to_unit=-1,
                        tokens_kept=decoded,
                    )
                )
                self.router.route(
                    s, Call(call.rollout, call.completion - decoded, 0.0), fresh=s.context
                )
            else:
                self.restart(s, discarded=sum(s.versions.values()) + decoded)

    def serve(self, u: int) -> None:
        """Unit ``u`` has loaded the rollout role: a new engine with the latest weights; its
        epochs continue the old one's so that no stale event matches."""
        old = self.engines[u].epoch
        e = Engine(
            u, self.costs, version=self.version, t_last=self.t, paused_until=self.t, epoch=old + 1
        )
        self.engines[u] = e
        self.router.fill(e)
        self.router.schedule(e)

    def on_deadline(self, i: int, _: int) -> bool:
        s = self.sessions[i]
        if s.status != "running" or s.deadline > self.t:
            return False
        if s.call is not None and not s.queued:
            e = self.engines[s.unit]
            self.switches.account(e.unit)
            decoded = e.remove(s.call, self.t)
            s.versions[e.version] += decoded - s.call.done
            s.tokens += decoded
            self.router.schedule(e)
            if not e.accepting and not e.active:
                self.switches.drained(e.unit)
        if s.call is not None:
            self.in_flight -= 1
        if s.queued:
            self.router.queued -= 1
        s.call, s.queued = None, False
        self.stats.timeouts += 1
        self.finish(s, "timeout")
        return True

    def finish(self, s: Session, status: str) -> None:
        s.status, s.finished = status, self.t
        self.router.set_unit(s, -1)
        self.live -= 1
        self.finishes.observe(self.t, s.tokens, self.ready.add(s))
        v = sorted(s.versions) or [self.version]
        self.sink.emit(
            ev.RolloutFinished(
                t=self.t,
                rollout_id=s.trace.rollout_id,
                status=status,
                progress=s.turn / len(s.trace.turns),
                reward=0.0,
                turns=s.turn,
                tokens=s.tokens,
                versions=(v[0], v[-1]),
            )
        )

    def restart(self, s: Session, discarded: int) -> None:
        """``restart`` switch mode: the session's call was aborted; it starts over."""
        self.stats.sessions_restarted += 1
        self.stats.tokens_discarded += discarded
        s.turn, s.context, s.tokens = 0, 0, 0
        self.router.set_unit(s, -1)
        s.versions.clear()
        s.call, s.queued = None, False
        self.in_flight -= 1
        s.start, s.deadline = self.t, self.t + s.trace.timeout_s
        self.push(s.deadline, DEADLINE, s.index)
        self.push(self.t, READY, s.index)

    # ------------------------------------------------------------------ training

    def start_step(self) -> None:
        units = self.cluster.with_role(TRAIN)
        if self.training or not units:
            return
        if self.costs.streaming:
            batch = self.ready.take(self.version, limit=self.costs.rollouts_per_step)
            if not batch:
                return
            self.step_epoch += 1
            self.open = OpenStep(self.version + 1, self.step_epoch, len(units), self.t)
            self.switches.start_step(units)
            self.consume(batch)
            return
        batch = self.ready.take(self.version)
        if batch is None:
            return
        tokens = self.count_batch(batch, self.version + 1)
        self.stats.tokens_trained += tokens
        self.stats.step_tokens.append(tokens)
        self.switches.start_step(units)
        secs = self.costs.step_s(tokens, len(units))
        self.push(self.t + secs, STEP, self.version + 1)

    def count_batch(self, batch: list[int], step: int) -> int:
        """The tokens step ``step`` trains of ``batch``; their lags and masked tokens."""
        tokens = 0
        for i in batch:
            s = self.sessions[i]
            tokens += s.tokens
            for v, n in s.versions.items():
                lag = step - 1 - v
                self.stats.staleness[lag] += n
                if lag > self.costs.staleness:
                    self.stats.tokens_masked += n
        return tokens

    def consume(self, batch: list[int]) -> None:
        """A streaming step takes ``batch``; once its whole batch is taken, its update is
        due when the units are done with it."""
        o = self.open
        assert o is not None
        o.add(self.t, self.count_batch(batch, o.step), len(batch), self.costs.train_tok_s)
        if o.taken >= self.costs.rollouts_per_step:
            o.full = True
            self.stats.tokens_trained += o.tokens
            self.stats.step_tokens.append(o.tokens)
            self.push(o.busy_until + self.costs.step_overhead_s, STEP, o.step, o.epoch)

    def feed_step(self) -> None:
        """The open step takes the groups ready since, and the units that entered training
        since join it while it has work left (its window closes when its update is due)."""
        o = self.open
        assert o is not None
        if o.busy_until > self.t:
            step_units = self.switches.step_units
            joined = [u for u in self.cluster.with_role(TRAIN) if u not in step_units]
            for u in joined:
                self.switches.account(u)
                step_units.append(u)
                o.join(self.t)
            if joined and o.full:  # the update comes sooner: its event again
                self.step_epoch += 1
                o.epoch = self.step_epoch
                self.push(o.busy_until + self.costs.step_overhead_s, STEP, o.step, o.epoch)
        if not o.full:
            batch = self.ready.take(self.version, limit=self.costs.rollouts_per_step - o.taken)
            if batch:
                self.consume(batch)

    def on_step(self, step: int, epoch: int) -> bool:
        if self.open is not None:
            if epoch != self.open.epoch:
                return False
            self.open = None
        self.switches.end_step()
        self.version = step
        self.makespan = self.t
        self.sink.emit(
            ev.StepFinished(
                t=self.t,
                step=step,
                version=step,
                metrics=self.ready.step_metrics(),
            )
        )
        if self.version < self.steps_total:
            self.publish()
        return True

    def publish(self) -> None:
        """Weight sync to every running engine: it pauses, its in-flight calls' tokens so
        far keep the old version, and the rest decode under the new one."""
        for e in self.engines:
            if self.cluster.roles[e.unit] not in (ROLLOUT, SWITCHING) or not e.accepting:
                continue
            e.advance(self.t)
            for call in e.active.values():
                d = e.decoded(call)
                self.sessions[call.rollout].versions[e.version] += d - call.done
                call.done = d
            e.version = self.version
            if self.costs.weight_sync_s > 0:
                e.pause(self.t, self.t + self.costs.weight_sync_s)
                self.router.schedule(e)

    # ------------------------------------------------------------------ results

    def summary(self) -> dict[str, Any]:
        return summarize(
            policy=self.policy.name,
            mode=self.mode,
            trace=self.trace,
            costs=self.costs,
            sessions=self.sessions,
            stats=self.stats,
            switches=self.switches,
            makespan=self.makespan,
            steps=self.version,
            units=len(self.cluster),
        )
