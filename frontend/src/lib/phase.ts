// A run's long phases (model build, engine start, warm start, benchmark) from its
// `phase_progress` events: the latest one is where the run is, shown as
// "warm start 250/1000, loss 0.412 (target 0.12)" (the terminal's line too).

import type { RunEvent } from "./types";

export interface Phase {
  phase: string;
  done: number;
  total: number;
  message: string;
  t: number;
}

// The latest phase_progress event of `events` (oldest first), or null before any.
export function latestPhase(events: RunEvent[]): Phase | null {
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i];
    if (e.kind !== "phase_progress") continue;
    return {
      phase: String(e.data.phase ?? ""),
      done: Number(e.data.done ?? 0),
      total: Number(e.data.total ?? 0),
      message: String(e.data.message ?? ""),
      t: e.t,
    };
  }
  return null;
}

export function phaseText(p: Phase): string {
  const head = `${p.phase} ${p.done}/${p.total}`;
  return p.message ? `${head}, ${p.message}` : head;
}

// Share of the phase done, 0..1 (a phase with no total counts as done).
export function phaseShare(p: Phase): number {
  return p.total > 0 ? Math.min(1, Math.max(0, p.done / p.total)) : 1;
}
