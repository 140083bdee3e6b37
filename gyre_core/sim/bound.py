"""A lower bound on a run's makespan: ``max(work, path)``.

* **work** — the work the run did, with every unit busy all the time at its best
  throughput: each decoded token at ``best_decode_tok_s`` (a unit full at
  ``max_seqs_per_unit``), each prefilled token at ``prefill_tok_s``, each trained token at
  ``train_tok_s``, spread over all units. It is the run's own work, not the trace's: a
  run whose rollouts time out (waiting for an engine, say) does less of it, and a bound
  from the trace would then overstate what that run had to do.
* **path** — every rollout must finish (or time out) before the last step trains, so the
  makespan is at least the longest ``min(timeout_s, critical path)``, the critical path
  being its calls one after another at the fastest single-sequence rate with its tool
  time between them, plus one step's overhead.

No switch, sync or drain cost is counted: the bound holds for every policy.
"""

from __future__ import annotations

from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout


def critical_path(trace: list[TraceRollout], c: CostModel) -> float:
    fast = c.seq_rate(1)
    longest = 0.0
    for r in trace:
        tools = sum(t.tool_s for t in r.turns[:-1])  # a rollout ends with its last call
        calls = sum(t.prompt_tokens / c.prefill_tok_s + t.completion_tokens / fast for t in r.turns)
        longest = max(longest, min(r.timeout_s, calls + tools))
    return longest + c.step_overhead_s


def lower_bound(
    trace: list[TraceRollout], c: CostModel, *, decoded: int, prefilled: int, trained: int
) -> float:
    unit_s = decoded / c.best_decode_tok_s + prefilled / c.prefill_tok_s + trained / c.train_tok_s
    return max(unit_s / c.units, critical_path(trace, c))
