"""Calibration: a finished real run measures its own costs and workload for the simulator.

At the end of every real run (``backend: real``) the runtime writes three files into its
work folder:

* ``costs.json`` — a :class:`~gyre_core.sim.costs.CostModel` table fitted to what the run
  measured (``gyre sim run --costs`` and ``CostModel.load`` read it);
* ``workload.jsonl`` — the run's own rollouts as a simulator trace (one rollout a line,
  ``docs/sim-workloads.md``), in the order the run admitted them;
* ``calibration.json`` — the measurements behind the table, the run's policy, and the
  wall time the simulator's makespan is compared with (``gyre sim predict WORKDIR``).

What is measured, and how each cost is derived (``docs/sim-costs.md``, "Calibration"):

* **Calls.** The run's :class:`~gyre_core.runtime.timed_router.TimedRouter` times every
  LLM call the sessions make (router to completion: engine choice, the Ray round trip,
  waiting for a batch slot, prefill and decode) and notes its engine. A call's *concurrency* is the time-weighted mean number
  of calls on its engine while it ran (itself included). The simulator charges a call of
  ``c`` completion tokens and ``k`` newly appended prompt tokens on a unit shared by ``n``
  ``c (n + half) / peak + k n / prefill`` seconds; that is linear in ``1/peak``,
  ``half/peak`` and ``1/prefill``, fitted by non-negative least squares over the calls.
  ``k`` is the trace's ``prompt_tokens`` (what a prefix-cached engine prefills); the torch
  engine re-prefills the whole context, and the fitted ``prefill_tok_s`` is the rate of
  *appended* tokens that accounts for that, plus every fixed per-call cost.
* **Training.** Each step's span (start of the step to the end of its bookkeeping and
  checkpoint, which the next step waits for) and its compute time (``train_s``: packing,
  gradients on the replicas, the optimizer step). ``train_tok_s`` = the batch's tokens as
  the simulator counts them (prompts + completions + compaction summaries of each rollout)
  over ``train_s`` times the units training; ``step_overhead_s`` = the mean span beyond
  ``train_s`` (weight publication, trees, payload file, checkpoint).
* **Switches and sync.** ``switch_s`` is the mean measured role switch (drain wait
  included); ``switch_to_train_s`` and ``switch_to_rollout_s`` the mean of each direction
  without its drain wait (the simulator waits for a draining engine itself; a vLLM engine
  that sleeps and wakes makes them differ most); ``weight_sync_s`` the mean publication of
  a version to the engines. The report gives the mean of each part of a switch
  (``switch_parts_s``, and ``switch_parts_by_role_s`` by the role switched into: drain,
  engine stop or sleep, start or wake with its weights, the training group's re-form, peer
  transfer, restore and offload).
* **Tool time.** A turn's ``tool_s`` is the time between its call's end and the next
  call's start: environment step, harness, tokenisation — all the session's time off the
  engines.
* From the config: units (``gpus``, one per unit), the rollouts per step, the group size,
  the staleness and admission bounds, the cap on running rollouts, the drain deadline,
  the engines' sequence cap and the router's affinity slack (``balance_abs``; the router has no relative threshold: ``balance_rel``
  1).

The compared wall time (``actual_s``) is the control loop's: from its start (engines up,
initial switches and the first benchmark done) to the end of the last step; model build,
Ray start, warm start and both benchmarks are outside it, as they are outside the
simulator's makespan.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gyre_core.cluster import ROLLOUT, TRAIN
from gyre_core.config import RunConfig
from gyre_core.runtime.timed_router import CallRecord, TimedRouter
from gyre_core.scheduler.config import SchedulerConfig
from gyre_core.scheduler.policies import fixed_split_policies
from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout, Turn, write_trace
from gyre_core.trajectory.format import Rollout, read_rollouts

if TYPE_CHECKING:
    from gyre_core.runtime.loop import Counters, Loop

COSTS, WORKLOAD, REPORT = "costs.json", "workload.jsonl", "calibration.json"
# When the fit finds no cost growing with the batch (or none for prefill), the table needs a
# finite stand-in: a half-saturation far above any batch (per-sequence rate flat in n), and
# a prefill rate at which prompts cost nothing measurable.
HALF_CAP = 10_000.0
PREFILL_CAP = 1e9
NO_TIMEOUT_S = 86_400.0  # rollout.time_budget_s 0 (no limit): a day stands in
_ROLLOUT_ID = re.compile(r"r(\d+)")


class CalibrationError(ValueError):
    """The run recorded too little to fit a cost table."""


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True, slots=True)
class CallSample:
    seconds: float
    completion: int  # tokens generated
    fresh: int  # prompt tokens appended since the session's previous call
    concurrency: float  # mean calls on its engine while it ran, itself included


@dataclass(frozen=True, slots=True)
class DecodeFit:
    decode_peak_tok_s: float
    decode_half: float
    prefill_tok_s: float
    calls: int
    rmse_s: float  # root mean square error of the fitted call times
    mean_s: float  # mean measured call time


def concurrency(records: list[CallRecord]) -> list[float]:
    """Each call's time-weighted mean number of calls on its engine (itself included): the
    integral of the engine's call count over the call's life, by a sweep over the starts
    and ends (``O(n log n)``: a long run logs many calls)."""
    out = [1.0] * len(records)
    by_engine: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_engine.setdefault(r.engine, []).append(i)
    for idx in by_engine.values():
        t0 = np.array([records[i].t0 for i in idx])
        t1 = np.array([records[i].t1 for i in idx])
        times = np.concatenate([t0, t1])
        steps = np.concatenate([np.ones(len(idx)), -np.ones(len(idx))])
        order = np.argsort(times, kind="stable")
        times, steps = times[order], steps[order]
        count = np.cumsum(steps)[:-1]  # calls in flight between consecutive breakpoints
        area = np.concatenate([[0.0], np.cumsum(count * np.diff(times))])  # integral so far
        a = area[np.searchsorted(times, t0)]
        b = area[np.searchsorted(times, t1)]
        for j, i in enumerate(idx):
            span = t1[j] - t0[j]
            out[i] = float((b[j] - a[j]) / span) if span > 0 else 1.0
    return out


def fit_calls(samples: list[CallSample]) -> DecodeFit:
    """Fit ``seconds = c n / peak + c half / peak + k n / prefill`` by non-negative least
    squares: the least-squares solution on every subset of the three terms, the best one
    whose coefficients are all positive (for three unknowns that is the exact NNLS)."""
    if len(samples) < 3:
        raise CalibrationError(f"{len(samples)} timed call(s): need at least 3 to fit decode")
    y = np.array([s.seconds for s in samples])
    n = np.array([s.concurrency for s in samples])
    c = np.array([float(s.completion) for s in samples])
    k = np.array([float(s.fresh) for s in samples])
    x = np.stack([c * n, c, k * n], axis=1)
    best: tuple[float, np.ndarray] | None = None
    for size in (3, 2, 1):
        for cols in combinations(range(3), size):
            if 0 not in cols and 1 not in cols:
                continue  # decode must cost something
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(coef <= 0):
                continue
            full = np.zeros(3)
            full[list(cols)] = coef
            sse = float(((x @ full - y) ** 2).sum())
            if best is None or sse < best[0]:
                best = (sse, full)
    if best is None:
        raise CalibrationError("no positive decode cost fits the timed calls")
    sse, (u, v, w) = best
    if u > 0:
        peak, half = 1.0 / u, v / u
    else:  # the per-sequence rate does not fall with the batch: 1/v at any n
        half = HALF_CAP
        peak = half / v
    prefill = 1.0 / w if w > 0 else PREFILL_CAP
    return DecodeFit(
        round(peak, 3),
        round(half, 4),
        round(prefill, 3),
        len(samples),
        round(math.sqrt(sse / len(samples)), 4),
        round(float(y.mean()), 4),
    )


@dataclass(frozen=True, slots=True)
class StepSample:
    start: float  # run clock
    end: float  # after bookkeeping and checkpoint: when the next step may start
    train_s: float  # packing + gradients + optimizer
    units: int  # units in the train role that computed it
    tokens: int  # the batch's tokens as the simulator counts them


def fit_training(steps: list[StepSample]) -> tuple[float, float]:
    """``(train_tok_s per unit, step_overhead_s)`` from the measured steps."""
    if not steps:
        raise CalibrationError("no training step recorded")
    unit_s = sum(s.train_s * max(s.units, 1) for s in steps)
    tokens = sum(s.tokens for s in steps)
    if unit_s <= 0 or tokens <= 0:
        raise CalibrationError("training steps recorded no time or no tokens")
    overhead = sum(max(0.0, s.end - s.start - s.train_s) for s in steps) / len(steps)
    return tokens / unit_s, overhead


# --------------------------------------------------------------------------- the workload


def rollout_turns(rollout: Rollout, records: dict[str, CallRecord]) -> tuple[Turn, ...]:
    """A rollout's calls as simulator turns: appended prompt tokens, completion tokens,
    tool time until the next call; a call that does not extend the previous one (after a
    compaction or a retry's restore) marks a ``compact_to`` on the turn before it."""
    raw: list[list[Any]] = []  # [prompt, completion, tool_s, compact_to]
    context = 0
    prev = None
    for call in rollout.calls:
        full = call.prompt_len
        if prev is None:
            prompt = full
        elif (
            call.prefix is not None
            and call.prefix.call_id == prev
            and call.prefix.tokens == context
        ):
            prompt = len(call.prompt_ids)
        else:
            keep = call.prefix.tokens if call.prefix is not None else 1
            keep = min(max(keep, 1), context)
            raw[-1][3] = keep
            context = keep
            prompt = max(0, full - keep)
        completion = max(1, len(call.completion_ids))
        raw.append([max(prompt, 1 if prev is None else 0), completion, 0.0, None])
        context += raw[-1][0] + completion
        prev = call.call_id
    for i in range(len(raw) - 1):
        a = records.get(f"{rollout.rollout_id}/{rollout.calls[i].call_id}")
        b = records.get(f"{rollout.rollout_id}/{rollout.calls[i + 1].call_id}")
        if a is not None and b is not None:
            raw[i][2] = round(max(0.0, b.t0 - a.t1), 6)
    return tuple(Turn(int(p), int(c), float(t), k) for p, c, t, k in raw)


def sim_tokens(turns: tuple[Turn, ...]) -> int:
    """The tokens the simulator trains for a rollout (its tree: prompts, completions,
    compaction summaries)."""
    return sum(t.prompt_tokens + t.completion_tokens + (t.compact_to or 0) for t in turns)


def _index(rollout_id: str) -> int:
    m = _ROLLOUT_ID.fullmatch(rollout_id)
    return int(m.group(1)) if m else -1


# --------------------------------------------------------------------------- the run


def write_calibration(
    workdir: Path, cfg: RunConfig, loop: Loop, router: TimedRouter, loop_start: float
) -> dict[str, Any]:
    """Fit and write ``costs.json``, ``workload.jsonl`` and ``calibration.json``. A run that
    recorded too little to fit (no step, too few calls) writes only ``calibration.json``
    with the reason under ``error``."""
    try:
        return _calibrate(workdir, cfg, loop, router, loop_start)
    except CalibrationError as exc:
        report = {"policy": cfg.policy, "error": str(exc)}
        (workdir / REPORT).write_text(json.dumps(report, indent=2) + "\n")
        return report


def _calibrate(
    workdir: Path, cfg: RunConfig, loop: Loop, router: TimedRouter, loop_start: float
) -> dict[str, Any]:
    spans = loop.counters.step_spans
    # the training rollouts' calls (not the benchmark's): ``r<index>/<call>``
    records = {r.request_id: r for r in router.records if _index(r.request_id.split("/")[0]) >= 0}
    trace, tokens_by_step, fresh = _trace(workdir, cfg, spans, records)
    steps = [
        StepSample(a, b, ts, u, tok)
        for (a, b, u), ts, tok in zip(spans, loop.counters.train_s, tokens_by_step, strict=False)
    ]
    train_tok_s, overhead = fit_training(steps)

    timed = [r for r in router.records if r.request_id in fresh]
    conc = concurrency(timed)
    samples = [
        CallSample(r.t1 - r.t0, r.completion_tokens, fresh[r.request_id], n)
        for r, n in zip(timed, conc, strict=True)
    ]
    decode = fit_calls(samples)
    costs = _costs(cfg, loop.counters, router, decode, train_tok_s, overhead, loop.max_seqs)
    (workdir / COSTS).write_text(json.dumps(costs.to_json(), indent=2) + "\n")
    write_trace(workdir / WORKLOAD, trace)
    report = _report(cfg, loop, loop_start, steps, decode, trace, records)
    report["costs"] = costs.to_json()
    (workdir / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _trace(
    workdir: Path,
    cfg: RunConfig,
    spans: list[tuple[float, float, int]],
    records: dict[str, CallRecord],
) -> tuple[list[TraceRollout], list[int], dict[str, int]]:
    """The trained steps' rollouts as a workload trace (in admission order), each step's
    simulated tokens, and each timed call's appended prompt tokens by request id."""
    steps_files = sorted((workdir / "rollouts").glob("step-*.jsonl"))
    batches = [list(read_rollouts(p)) for p in steps_files]
    batches = batches[len(batches) - len(spans) :] if spans else []
    timeout_s = cfg.rollout.time_budget_s or NO_TIMEOUT_S
    trace: list[TraceRollout] = []
    tokens_by_step: list[int] = []
    fresh: dict[str, int] = {}  # request id -> the call's appended prompt tokens
    for batch in batches:
        total = 0
        for r in batch:
            turns = rollout_turns(r, records)
            total += sim_tokens(turns)
            trace.append(TraceRollout(r.rollout_id, r.task_id, r.group_id, turns, timeout_s))
            for call, turn in zip(r.calls, turns, strict=True):
                fresh[f"{r.rollout_id}/{call.call_id}"] = turn.prompt_tokens
        tokens_by_step.append(total)
    trace.sort(key=lambda tr: (_index(tr.rollout_id), tr.rollout_id))  # admission order
    return trace, tokens_by_step, fresh


def _costs(
    cfg: RunConfig,
    c: Counters,
    router: TimedRouter,
    decode: DecodeFit,
    train_tok_s: float,
    overhead: float,
    max_seqs: int,
) -> CostModel:
    """The simulator's cost table measured from the run (``max_seqs``: the engines' batch
    cap the loop ran with)."""
    return CostModel(
        gpus=cfg.cluster.units,
        gpus_per_unit=1,
        gpus_per_node=1,
        decode_peak_tok_s=decode.decode_peak_tok_s,
        decode_half=decode.decode_half,
        max_seqs_per_unit=max_seqs,
        prefill_tok_s=decode.prefill_tok_s,
        train_tok_s=round(train_tok_s, 3),
        switch_s=round(_mean(c.switch_s), 4),
        switch_to_train_s=round(_mean(_switches(c, TRAIN)), 4),
        switch_to_rollout_s=round(_mean(_switches(c, ROLLOUT)), 4),
        weight_sync_s=round(_mean(c.weight_sync_s), 4),
        drain_s=cfg.scheduler.drain_deadline_s,
        rollouts_per_step=cfg.rollout.tasks_per_step * cfg.rollout.group_size,
        group_size=cfg.rollout.group_size,
        staleness=cfg.scheduler.staleness_bound,
        admission_staleness=cfg.scheduler.admission_staleness,
        max_concurrent=cfg.scheduler.max_concurrent_rollouts,
        burst_steps=cfg.scheduler.bursts,
        step_overhead_s=round(overhead, 4),
        balance_abs=router.affinity_slack,
        balance_rel=1.0,
    )


def _report(
    cfg: RunConfig,
    loop: Loop,
    loop_start: float,
    steps: list[StepSample],
    decode: DecodeFit,
    trace: list[TraceRollout],
    records: dict[str, CallRecord],
) -> dict[str, Any]:
    """``calibration.json`` but its ``costs``: the run's policy, timings and fits."""
    from gyre_core.scheduler.policies import Async

    c, spans = loop.counters, loop.counters.step_spans
    return {
        "policy": cfg.policy,
        "split": (
            f"{loop.policy.rollout_units}:{loop.policy.train_units}"
            if isinstance(loop.policy, Async)
            else None
        ),
        "switch_mode": cfg.scheduler.switch_mode,
        "batch_order": cfg.scheduler.batch_order,
        "scheduler": asdict(cfg.scheduler),  # predict's policy: the run's own knobs
        "actual_s": round(spans[-1][1] - loop_start, 3),
        "compared": "control loop start (engines up, initial roles taken, benchmark done) "
        "to the end of the last step (its weight publication, bookkeeping and checkpoint)",
        "loop_start_s": loop_start,
        "steps": [asdict(s) for s in steps],
        "decode_fit": asdict(decode),
        "switch_s": [round(x, 4) for x in c.switch_s],
        "switch_parts_s": _parts(c.switch_parts),
        "switch_parts_by_role_s": {
            role: _parts(
                [p for p, to in zip(c.switch_parts, c.switch_to, strict=True) if to == role]
            )
            for role in (TRAIN, ROLLOUT)
        },
        "weight_sync_s": [round(x, 4) for x in c.weight_sync_s],
        "tool_s_mean": round(_mean([t.tool_s for tr in trace for t in tr.turns[:-1]]), 5),
        "rollouts": _rollout_spans(trace, records),
    }


def _rollout_spans(trace: list[TraceRollout], records: dict[str, CallRecord]) -> list[Any]:
    """Per rollout, on the run clock: its first call's start, its last call's end, and the
    seconds its calls took together (for reading a run against its simulation)."""
    by_rollout: dict[str, list[CallRecord]] = {}
    for r in records.values():
        by_rollout.setdefault(r.request_id.split("/")[0], []).append(r)
    out: list[Any] = []
    for tr in trace:
        if recs := by_rollout.get(tr.rollout_id):
            first, last = min(r.t0 for r in recs), max(r.t1 for r in recs)
            busy = sum(r.t1 - r.t0 for r in recs)
            out.append([tr.rollout_id, round(first, 3), round(last, 3), round(busy, 3)])
    return out


def _switches(c: Counters, role: str) -> list[float]:
    """The measured switches into ``role``, less their drain wait (the simulator waits for
    a draining engine by itself)."""
    return [
        s - p.get("drain_s", 0.0)
        for s, p, to in zip(c.switch_s, c.switch_parts, c.switch_to, strict=True)
        if to == role
    ]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# --------------------------------------------------------------------------- prediction


def predict(workdir: Path, *, policy: str | None = None) -> dict[str, Any]:
    """Simulate the run's policy (or ``policy``) on its own cost table and workload; the
    predicted makespan against the run's measured loop time."""
    from gyre_core.scheduler.policies import policy_for
    from gyre_core.sim.simulator import Simulator
    from gyre_core.sim.workload import read_trace

    def need(name: str) -> Path:
        if not (workdir / name).exists():
            raise CalibrationError(f"{workdir / name}: missing (a real run writes it at its end)")
        return workdir / name

    report = json.loads(need(REPORT).read_text())
    if "error" in report:
        raise CalibrationError(f"{workdir}: the run was not calibrated: {report['error']}")
    costs = CostModel.load(need(COSTS))
    trace = read_trace(need(WORKLOAD))
    name = policy or str(report["policy"])
    sim = Simulator(
        trace,
        costs,
        policy_for(_scheduler(report, name), costs.units),
        mode=str(report.get("switch_mode", "migrate")),
        batch_order=str(report.get("batch_order", "arrival")),
    ).run()
    predicted = float(sim["makespan_s"])
    actual = float(report["actual_s"])
    return {
        "policy": name,
        "predicted_s": round(predicted, 3),
        "actual_s": actual,
        "error": round((predicted - actual) / actual, 4) if actual > 0 else None,
        "compared": report.get("compared", ""),
        "steps": sim["steps"],
        "rollouts": sim["rollouts"],
        "role_switches_predicted": sim["role_switches"],
        "costs": costs.to_json(),
    }


def _scheduler(report: dict[str, Any], policy: str) -> SchedulerConfig:
    """The run's scheduler section with ``policy``; a report written before the section was
    recorded gives its async split (``"R:T"``) and defaults for the rest."""
    known = {f.name for f in fields(SchedulerConfig)}
    section = {k: v for k, v in (report.get("scheduler") or {}).items() if k in known}
    if "scheduler" not in report and report.get("split"):
        section["rollout_units"] = int(str(report["split"]).split(":")[0])
    if policy not in fixed_split_policies():
        section["rollout_units"] = 0  # the run's split means nothing to another policy
    return SchedulerConfig(**{**section, "policy": policy})


def _parts(switches: list[dict[str, float]]) -> dict[str, float]:
    """The mean seconds of each part over the switches that had it."""
    seen: dict[str, list[float]] = {}
    for parts in switches:
        for name, secs in parts.items():
            seen.setdefault(name, []).append(secs)
    return {name: round(_mean(xs), 4) for name, xs in sorted(seen.items())}
