"""A lower bound on a run's makespan: ``max(work, path, admission)``.

Every term uses the run's own work, not the trace's: a run whose rollouts time out
(waiting for an engine, say) does less of it, and a bound from the trace would then
overstate what that run had to do. Step ``k`` trained ``T_k`` tokens; it cannot take
less than ``step_overhead_s + T_k / (train_tok_s * units)`` -- every unit training it at
full rate -- and steps run one after another.

* **work** — every unit busy all the time at its best throughput: each decoded token at
  ``best_decode_tok_s`` (a unit full at ``max_seqs_per_unit``), each prefilled token at
  ``prefill_tok_s``, each trained token at ``train_tok_s``, spread over all units.
* **path** — the longest trained rollout's ``min(timeout_s, critical path)``, the
  critical path being its calls one after another at the fastest single-sequence rate
  with its tool time between them; then at least the last step, which comes after the
  step that trains it.
* **admission** — the same path argument, step by step, under the admission rule every
  policy obeys (:attr:`Snapshot.admissible`): rollout ``i`` (trace order) may not start
  before version ``max(0, i // B - ahead)`` is published (``ahead``: the admission
  staleness, :attr:`CostModel.admission_ahead`), and step ``k`` may not start
  before ``k * B`` rollouts have finished nor before step ``k - 1`` ended. With unlimited
  engines every rollout starting the moment it may and running its critical path, that
  gives the earliest time ``P_k`` each version can be published; the makespan is at least
  ``P_steps``. Colocate admits less than the rule allows, and a cap on running rollouts
  (``max_concurrent``) only delays starts, so the bound holds for them too.

No switch, sync or drain cost is counted: the bound holds for every policy.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout


def rollout_path(r: TraceRollout, c: CostModel) -> float:
    """The shortest time ``r`` can take: ``min(timeout_s, calls back to back + tools)``."""
    fast = c.seq_rate(1)
    tools = sum(t.tool_s for t in r.turns[:-1])  # a rollout ends with its last call
    calls = sum(t.prompt_tokens / c.prefill_tok_s + t.completion_tokens / fast for t in r.turns)
    return min(r.timeout_s, calls + tools)


def step_time(tokens: int, c: CostModel) -> float:
    """The shortest a step training ``tokens`` can take: on every unit at once."""
    return c.step_s(tokens, c.units)


def _step_times(c: CostModel, steps: int, step_tokens: Sequence[int]) -> list[float]:
    return [step_time(step_tokens[k] if k < len(step_tokens) else 0, c) for k in range(steps)]


def critical_path(
    trace: list[TraceRollout], c: CostModel, step_tokens: Sequence[int] = ()
) -> float:
    steps = len(trace) // c.rollouts_per_step
    trained = trace[: steps * c.rollouts_per_step]
    last = _step_times(c, steps, step_tokens)[-1] if steps else c.step_overhead_s
    return max((rollout_path(r, c) for r in trained), default=0.0) + last


def admission_path(
    trace: list[TraceRollout], c: CostModel, step_tokens: Sequence[int] = ()
) -> float:
    """``P_steps`` of the recursion in the module docstring."""
    b, steps = c.rollouts_per_step, len(trace) // c.rollouts_per_step
    paths = [rollout_path(r, c) for r in trace[: steps * b]]
    took = _step_times(c, steps, step_tokens)
    published = [0.0]  # P_0
    finishes: list[float] = []  # sorted finish times of the rollouts that may start by now
    admitted = 0
    for k in range(1, steps + 1):
        # rollouts allowed to start once version k - 1 is out: i // b <= k - 1 + ahead
        allowed = min(steps * b, (k + c.admission_ahead) * b)
        while admitted < allowed:
            v = max(0, admitted // b - c.admission_ahead)
            bisect.insort(finishes, published[v] + paths[admitted])
            admitted += 1
        # the (k*b)-th earliest finish among them, then the step itself
        published.append(max(published[-1], finishes[k * b - 1]) + took[k - 1])
    return published[-1]


def lower_bound(
    trace: list[TraceRollout],
    c: CostModel,
    *,
    decoded: int,
    prefilled: int,
    step_tokens: Sequence[int],
) -> float:
    """``step_tokens``: the tokens each step of the run trained, in order."""
    trained = sum(step_tokens)
    unit_s = decoded / c.best_decode_tok_s + prefilled / c.prefill_tok_s + trained / c.train_tok_s
    return max(
        unit_s / c.units,
        critical_path(trace, c, step_tokens),
        admission_path(trace, c, step_tokens),
    )
