// Rollout progress from rollout_started/progress/finished events: the in-flight set and
// the distribution of finished durations (with timeouts counted apart).

import type { RunEvent } from "./types";

export interface RolloutState {
  id: string;
  taskId: string;
  groupId: string;
  step: number;
  started: number; // run clock
  updated: number;
  turns: number;
  tokens: number;
  progress: number;
  branches: Record<string, number>;
}

export interface FinishedRollout extends RolloutState {
  status: string;
  reward: number;
  duration: number;
}

export interface Histogram {
  edges: number[]; // bins + 1 edges
  counts: number[];
  timeouts: number[]; // the part of each bin that timed out
}

const KEEP_FINISHED = 500; // recent finished rollouts kept in full; durations are all kept

export class RolloutTracker {
  readonly inflight = new Map<string, RolloutState>();
  readonly recent: FinishedRollout[] = [];
  readonly durations: number[] = [];
  readonly timedOut: boolean[] = [];
  readonly statusCounts: Record<string, number> = {};
  now = 0;

  apply(ev: RunEvent): boolean {
    if (ev.t > this.now) this.now = ev.t;
    const d = ev.data;
    const id = String(d.rollout_id ?? "");
    if (ev.kind === "rollout_started") {
      this.inflight.set(id, {
        id,
        taskId: String(d.task_id ?? ""),
        groupId: String(d.group_id ?? ""),
        step: Number(d.step ?? 0),
        started: ev.t,
        updated: ev.t,
        turns: 0,
        tokens: 0,
        progress: 0,
        branches: {},
      });
      return true;
    }
    if (ev.kind === "rollout_progress") {
      const r = this.inflight.get(id);
      if (!r) return false;
      r.turns = Number(d.turns ?? r.turns);
      r.tokens = Number(d.tokens ?? r.tokens);
      r.progress = Number(d.progress ?? r.progress);
      r.branches = (d.branches as Record<string, number>) ?? r.branches;
      r.updated = ev.t;
      return true;
    }
    if (ev.kind === "rollout_finished") {
      const r = this.inflight.get(id);
      this.inflight.delete(id);
      const started = r?.started ?? ev.t;
      const status = String(d.status ?? "done");
      const done: FinishedRollout = {
        ...(r ?? { id, taskId: "", groupId: "", step: 0, started, branches: {} }),
        updated: ev.t,
        turns: Number(d.turns ?? 0),
        tokens: Number(d.tokens ?? 0),
        progress: Number(d.progress ?? 0),
        status,
        reward: Number(d.reward ?? 0),
        duration: ev.t - started,
      };
      this.recent.push(done);
      if (this.recent.length > KEEP_FINISHED) this.recent.shift();
      this.durations.push(done.duration);
      this.timedOut.push(isTimeout(status));
      this.statusCounts[status] = (this.statusCounts[status] ?? 0) + 1;
      return true;
    }
    return false;
  }

  /** In-flight rollouts, oldest first, with their elapsed time on the run clock. */
  running(): (RolloutState & { elapsed: number })[] {
    return [...this.inflight.values()]
      .sort((a, b) => a.started - b.started || a.id.localeCompare(b.id))
      .map((r) => ({ ...r, elapsed: Math.max(0, this.now - r.started) }));
  }

  histogram(bins = 20): Histogram {
    const n = this.durations.length;
    if (!n) return { edges: [], counts: [], timeouts: [] };
    let lo = Infinity;
    let hi = -Infinity;
    for (const x of this.durations) {
      if (x < lo) lo = x;
      if (x > hi) hi = x;
    }
    const width = hi > lo ? (hi - lo) / bins : 1;
    const edges = Array.from({ length: bins + 1 }, (_, i) => lo + i * width);
    const counts = new Array<number>(bins).fill(0);
    const timeouts = new Array<number>(bins).fill(0);
    this.durations.forEach((x, i) => {
      const b = Math.min(bins - 1, Math.floor((x - lo) / width));
      counts[b]++;
      if (this.timedOut[i]) timeouts[b]++;
    });
    return { edges, counts, timeouts };
  }
}

export function isTimeout(status: string): boolean {
  return status === "timeout" || status === "timed_out" || status === "truncated";
}
