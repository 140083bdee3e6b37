// Metrics by wall time: a run's step N happened at the run-clock `t` (seconds) of its
// `step_finished` event for step N (GET /api/runs/{id}/events/?kind=step_finished), so a
// series by step maps onto seconds; steps not finished yet (no such event) are dropped.

import { api } from "./api";
import type { MetricBucket, RunEvent } from "./types";

/** step -> run-clock seconds, from `step_finished` events (a later event for a step wins). */
export type StepTimes = Map<number, number>;

export function addStepTimes(times: StepTimes, events: RunEvent[]): StepTimes {
  for (const ev of events) {
    if (ev.kind !== "step_finished") continue;
    const step = Number(ev.data.step);
    if (Number.isFinite(step) && Number.isFinite(ev.t)) times.set(step, ev.t);
  }
  return times;
}

/**
 * A series by step as a series by time: each server bucket is placed at the time of its last
 * step (the step its `last` value belongs to); buckets whose step has no time are dropped.
 * The result is sorted by time.
 */
export function bucketsByTime(points: MetricBucket[], times: StepTimes): { x: number[]; y: number[] } {
  const pairs: [number, number][] = [];
  for (const p of points) {
    const t = times.get(p.last_step);
    if (t !== undefined) pairs.push([t, p.last]);
  }
  pairs.sort((a, b) => a[0] - b[0]);
  return { x: pairs.map((p) => p[0]), y: pairs.map((p) => p[1]) };
}

export interface TimeUnit {
  label: string; // the x axis label
  seconds: number; // seconds per unit
}

/** Seconds up to an hour of run clock, minutes beyond. */
export function timeUnit(maxSeconds: number): TimeUnit {
  return maxSeconds > 3600 ? { label: "wall time (min)", seconds: 60 } : { label: "wall time (s)", seconds: 1 };
}

export const STEP_EVENTS_PAGE = 10000; // the events endpoint's largest page

/**
 * Read a run's step times after `cursor` (the last seq read), page by page, into `times`;
 * -> the new cursor. Stops after `maxPages` pages (the next call goes on from there).
 */
export async function fetchStepTimes(run: number, times: StepTimes, cursor = 0, maxPages = 20): Promise<number> {
  for (let i = 0; i < maxPages; i++) {
    const { events } = await api<{ events: RunEvent[] }>(
      `/api/runs/${run}/events/?kind=step_finished&after=${cursor}&limit=${STEP_EVENTS_PAGE}`,
    );
    addStepTimes(times, events);
    if (events.length) cursor = events[events.length - 1].seq;
    if (events.length < STEP_EVENTS_PAGE) break;
  }
  return cursor;
}
