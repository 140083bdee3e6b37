"""Lower bounds on a makespan: ``max(work, path, admission)``.

:func:`trace_bound` is the **policy-independent** bound, from the trace and the costs
alone; every policy's efficiency is measured against it (see its docstring).
:func:`lower_bound` is the **per-run** bound, a diagnostic: every term uses the run's own
work, not the trace's: a run whose rollouts time out
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

Under streaming (``CostModel.streaming``) a step trains its batch as it arrives, so after
its last rollout it needs only its update: the path and admission terms count the step's
whole time from the previous publish, and from its batch's last rollout only
``step_overhead_s``.

No switch, sync or drain cost is counted: the bound holds for every policy.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout


def full_path(r: TraceRollout, c: CostModel) -> float:
    """``r``'s calls back to back at the fastest rate, with its tool time between them."""
    fast, prefill = c.seq_rate(1), c.prefill_tok_s
    prompts = completions = 0
    tools = -r.turns[-1].tool_s if r.turns else 0.0  # a rollout ends with its last call
    for t in r.turns:
        prompts += t.prompt_tokens
        completions += t.completion_tokens
        tools += t.tool_s
    return tools + prompts / prefill + completions / fast


def rollout_path(r: TraceRollout, c: CostModel) -> float:
    """The shortest time ``r`` can take: ``min(timeout_s, calls back to back + tools)``."""
    return min(r.timeout_s, full_path(r, c))


def step_time(tokens: int, c: CostModel) -> float:
    """The shortest a step training ``tokens`` can take: on every unit at once."""
    return c.step_s(tokens, c.units)


def _step_times(c: CostModel, steps: int, step_tokens: Sequence[int]) -> list[float]:
    return [step_time(step_tokens[k] if k < len(step_tokens) else 0, c) for k in range(steps)]


def _publish(c: CostModel, previous: float, ready: float, took: float) -> float:
    """The earliest a step can publish: after the previous one (its weights are the ones
    it trains) by its own time, and after its batch is ``ready``: by its whole time, or
    under streaming (which trains the batch as it arrives) by the update alone."""
    if c.streaming:
        return max(previous + took, ready + c.step_overhead_s)
    return max(previous, ready) + took


def critical_path(
    trace: list[TraceRollout], c: CostModel, step_tokens: Sequence[int] = ()
) -> float:
    steps = len(trace) // c.rollouts_per_step
    trained = trace[: steps * c.rollouts_per_step]
    last = _step_times(c, steps, step_tokens)[-1] if steps else c.step_overhead_s
    if c.streaming:  # the last step may have trained all but the last rollout already
        last = c.step_overhead_s
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
        published.append(_publish(c, published[-1], finishes[k * b - 1], took[k - 1]))
    return published[-1]


def window_path(
    rollout_s: Sequence[float], c: CostModel, took: Sequence[float], train_s: float = 0.0
) -> float:
    """The admission chain with the engines' throughput. Rollout ``i`` may start only once
    version ``i // B - ahead`` is out, so of the ``k * B`` rollouts step ``k`` needs, at
    least ``(k - v - ahead) * B`` may start only after version ``v`` is published at
    ``P_v``; all units at their best throughput still need the smallest of those rollouts'
    unit-seconds (``rollout_s``: decode at ``best_decode_tok_s``, prefill at
    ``prefill_tok_s``), and the steps ``v + 1 .. k - 1`` train in between (``train_s``
    unit-seconds each at least), all spread over the units. So ``P_k >= P_v + that /
    units + took[k-1]`` for every ``v < k``; returns ``P_steps``."""
    b, ahead, steps = c.rollouts_per_step, c.admission_ahead, len(took)
    published = [0.0]
    for k in range(1, steps + 1):
        best = 0.0
        for v in range(k):
            need = (k - v - ahead) * b
            if need <= 0:
                continue
            pool = sorted(rollout_s[(v + ahead) * b : (k + ahead) * b])
            work = sum(pool[:need]) + (k - 1 - v) * train_s
            best = max(best, published[v] + work / c.units)
        published.append(_publish(c, published[-1], best, took[k - 1]))
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


def reached(r: TraceRollout, c: CostModel) -> tuple[int, float]:
    """The most of ``r`` any policy can run before its timeout -> (the tokens its tree
    holds then, the unit-seconds they took at best throughput). Its calls run back to back
    at the single-sequence rate with its tool time between them, the fastest any rollout
    goes: a turn's prompt counts from the turn's start, its completion as it decodes (a
    compaction's summary once the turn ends); all of it for a rollout that fits."""
    fast, t, tokens, unit_s = c.seq_rate(1), 0.0, 0.0, 0.0
    for turn in r.turns:
        if t >= r.timeout_s:
            break
        tokens += turn.prompt_tokens
        unit_s += turn.prompt_tokens / c.prefill_tok_s
        t += turn.prompt_tokens / c.prefill_tok_s
        decoded = min(turn.completion_tokens, max(0.0, (r.timeout_s - t) * fast))
        tokens += decoded
        unit_s += decoded / c.best_decode_tok_s
        if decoded < turn.completion_tokens:
            break
        tokens += turn.compact_to or 0
        t += turn.completion_tokens / fast + turn.tool_s
    return int(tokens), unit_s


def trace_bound(trace: list[TraceRollout], c: CostModel) -> dict[str, float]:
    """The policy-independent lower bound on the makespan of ``trace`` under ``c``, with
    its terms (seconds) and ``tokens``, the most any policy can train.

    Each rollout counts for the part of it that fits in its timeout (:func:`reached`; all
    of it for most), and every policy trains the same rollouts in the same number of
    steps. The terms:

    * **work** -- every unit busy all the time at its best throughput: each completion
      token decoded at ``best_decode_tok_s``, each prompt token prefilled once
      (``prefill_tok_s``: a perfect prefix cache, no re-prefill), each token trained at
      ``train_tok_s``, and every step's ``step_overhead_s`` paid on each of the
      ``min_train_units`` it needs at least (**the memory floor**), over all units.
    * **path** -- the longest rollout's critical path (capped by its timeout), then the
      shortest step.
    * **admission** -- :func:`admission_path` with each step's time that of the ``B``
      smallest rollouts trained on every unit.
    * **windows** -- :func:`window_path`: the admission chain again, with the engines'
      throughput: the rollouts that may start only after a version is published must
      still be decoded and prefilled on the units.

    Makespan bounds a run that does all the trace's work; a run that times out rollouts
    does less, so efficiency compares goodputs: a run's against ``tokens / bound``."""
    b, steps = c.rollouts_per_step, len(trace) // c.rollouts_per_step
    trained = trace[: steps * b]
    parts = [reached(r, c) for r in trained]
    rollout_s = [u for _, u in parts]  # decode, and every prompt prefilled once
    sizes = sorted(n for n, _ in parts)
    tokens = sum(sizes)
    overhead = c.min_train_units * c.step_overhead_s  # a step's, on the fewest units
    unit_s = sum(rollout_s) + tokens / c.train_tok_s + steps * overhead
    smallest = [sum(sizes[:b])] * steps
    took = _step_times(c, steps, smallest)
    terms = {
        "work_s": unit_s / c.units,
        "path_s": critical_path(trained, c, smallest),
        "admission_s": admission_path(trained, c, smallest),
        "windows_s": window_path(rollout_s, c, took, smallest[0] / c.train_tok_s + overhead),
    }
    return {"bound_s": max(terms.values()), **terms, "tokens": float(tokens)}
