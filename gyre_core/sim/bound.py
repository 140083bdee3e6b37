"""A lower bound on any policy's makespan for a trace under a cost model.

``max(work, path)``:

* **work** — every unit busy all the time at its best throughput: each call's prefill at
  ``prefill_tok_s`` and its decode at ``best_decode_tok_s`` (the unit full at
  ``max_seqs_per_unit``), plus every trained token at ``train_tok_s``, spread over all
  units. A rollout that may time out counts only the turns it is sure to finish before
  its timeout even at the slowest decode rate, so the work is never overstated.
* **path** — the longest rollout's critical path: its calls one after another at the
  fastest single-sequence rate, with its tool time, capped at its timeout; then the step
  that trains it, at best on every unit, plus the step overhead.

No switch, sync or drain cost is counted: the bound holds for every policy.
"""

from __future__ import annotations

from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout


def lower_bound(trace: list[TraceRollout], c: CostModel) -> float:
    units = c.units
    fast, slow = c.seq_rate(1), c.seq_rate(c.max_seqs_per_unit)
    unit_s = 0.0
    path = 0.0
    for r in trace:
        elapsed_slow = elapsed_fast = 0.0
        tokens = 0
        last = len(r.turns) - 1
        for i, turn in enumerate(r.turns):
            tool = turn.tool_s if i < last else 0.0  # a rollout ends with its last call
            prefill = turn.prompt_tokens / c.prefill_tok_s
            elapsed_slow += prefill + turn.completion_tokens / slow
            if elapsed_slow <= r.timeout_s:
                unit_s += prefill + turn.completion_tokens / c.best_decode_tok_s
                tokens += turn.prompt_tokens + turn.completion_tokens + (turn.compact_to or 0)
            elapsed_slow += tool
            elapsed_fast += prefill + turn.completion_tokens / fast + tool
        unit_s += tokens / c.train_tok_s
        crit = min(elapsed_fast, r.timeout_s) + c.step_overhead_s + tokens / (c.train_tok_s * units)
        path = max(path, crit)
    return max(unit_s / units, path)
