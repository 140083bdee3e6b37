"""A lower bound on a run's makespan: ``max(work, path, admission)``.

* **work** — the work the run did, with every unit busy all the time at its best
  throughput: each decoded token at ``best_decode_tok_s`` (a unit full at
  ``max_seqs_per_unit``), each prefilled token at ``prefill_tok_s``, each trained token at
  ``train_tok_s``, spread over all units. It is the run's own work, not the trace's: a
  run whose rollouts time out (waiting for an engine, say) does less of it, and a bound
  from the trace would then overstate what that run had to do.
* **path** — every trained rollout must finish (or time out) before the last step
  trains, so the makespan is at least the longest ``min(timeout_s, critical path)``, the
  critical path being its calls one after another at the fastest single-sequence rate
  with its tool time between them, plus one step's overhead.
* **admission** — the same path argument, step by step, under the staleness rule every
  policy obeys (:attr:`Snapshot.admissible`): rollout ``i`` (trace order) may not start
  before version ``max(0, i // B - staleness)`` is published, and step ``k`` may not start
  before ``k * B`` rollouts have finished nor before step ``k - 1`` ended. With unlimited
  GPUs every rollout starting the moment it may and running its critical path, that gives
  the earliest time ``P_k`` each version can be published; the makespan is at least
  ``P_steps``. Colocate admits less than the rule allows, so the bound holds for it too.

No switch, sync or drain cost is counted: the bound holds for every policy.
"""

from __future__ import annotations

import bisect

from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout


def rollout_path(r: TraceRollout, c: CostModel) -> float:
    """The shortest time ``r`` can take: ``min(timeout_s, calls back to back + tools)``."""
    fast = c.seq_rate(1)
    tools = sum(t.tool_s for t in r.turns[:-1])  # a rollout ends with its last call
    calls = sum(t.prompt_tokens / c.prefill_tok_s + t.completion_tokens / fast for t in r.turns)
    return min(r.timeout_s, calls + tools)


def critical_path(trace: list[TraceRollout], c: CostModel) -> float:
    trained = trace[: (len(trace) // c.rollouts_per_step) * c.rollouts_per_step]
    return max((rollout_path(r, c) for r in trained), default=0.0) + c.step_overhead_s


def admission_path(trace: list[TraceRollout], c: CostModel) -> float:
    """``P_steps`` of the recursion in the module docstring."""
    b, steps = c.rollouts_per_step, len(trace) // c.rollouts_per_step
    paths = [rollout_path(r, c) for r in trace[: steps * b]]
    published = [0.0]  # P_0
    finishes: list[float] = []  # sorted finish times of the rollouts that may start by now
    admitted = 0
    for k in range(1, steps + 1):
        # rollouts allowed to start once version k - 1 is out: i // b <= k - 1 + staleness
        allowed = min(steps * b, (k + c.staleness) * b)
        while admitted < allowed:
            v = max(0, admitted // b - c.staleness)
            bisect.insort(finishes, published[v] + paths[admitted])
            admitted += 1
        # the (k*b)-th earliest finish among them
        published.append(max(published[-1], finishes[k * b - 1]) + c.step_overhead_s)
    return published[-1]


def lower_bound(
    trace: list[TraceRollout], c: CostModel, *, decoded: int, prefilled: int, trained: int
) -> float:
    unit_s = decoded / c.best_decode_tok_s + prefilled / c.prefill_tok_s + trained / c.train_tok_s
    return max(unit_s / c.units, critical_path(trace, c), admission_path(trace, c))
