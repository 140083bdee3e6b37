// Metric series: the server's downsampled buckets (min/max/last per bucket of steps) with
// live `step_finished` / `benchmark` points appended after the server's last step.

import type { MetricsResponse, RunEvent } from "./types";

export interface Series {
  x: number[]; // step
  y: number[]; // last value of the bucket, or the live value
  lo: number[];
  hi: number[];
  serverUntil: number; // last step covered by the server's buckets
}

export const CHARTED = [
  "reward",
  "benchmark",
  "loss",
  "kl",
  "entropy",
  "staleness",
  "tokens_per_s",
  "dedup_ratio",
];

function empty(): Series {
  return { x: [], y: [], lo: [], hi: [], serverUntil: -Infinity };
}

export class MetricStore {
  readonly series = new Map<string, Series>();
  version = 0; // bumps on every change, for cheap React invalidation

  /** Replace what the server sent for `run` (keeps live points past the server's range). */
  loadServer(resp: MetricsResponse, run?: number): void {
    for (const s of resp.series) {
      if (run !== undefined && s.run !== run) continue;
      const old = this.series.get(s.name);
      const fresh = empty();
      for (const p of s.points) {
        fresh.x.push(p.step);
        fresh.y.push(p.last);
        fresh.lo.push(p.min);
        fresh.hi.push(p.max);
        fresh.serverUntil = Math.max(fresh.serverUntil, p.last_step);
      }
      if (old)
        old.x.forEach((x, i) => {
          if (x > fresh.serverUntil) push(fresh, x, old.y[i]);
        });
      this.series.set(s.name, fresh);
    }
    this.version++;
  }

  /** Append live points from an event; returns true when a series changed. */
  apply(ev: RunEvent): boolean {
    if (ev.kind === "step_finished") {
      const step = Number(ev.data.step);
      const metrics = (ev.data.metrics ?? {}) as Record<string, number>;
      let changed = false;
      for (const [name, value] of Object.entries(metrics))
        if (typeof value === "number") changed = this.add(name, step, value) || changed;
      return changed;
    }
    if (ev.kind === "benchmark") {
      return this.add(`benchmark/${String(ev.data.suite)}`, Number(ev.data.step), Number(ev.data.score));
    }
    return false;
  }

  add(name: string, step: number, value: number): boolean {
    let s = this.series.get(name);
    if (!s) {
      s = empty();
      this.series.set(name, s);
    }
    if (step <= s.serverUntil) return false; // the server's buckets already hold it
    const last = s.x.length - 1;
    if (last >= 0 && s.x[last] >= step) {
      if (s.x[last] !== step) return false; // out of order: ignore
      s.y[last] = s.lo[last] = s.hi[last] = value;
    } else push(s, step, value);
    this.version++;
    return true;
  }

  names(): string[] {
    return [...this.series.keys()].sort();
  }

  /** Series whose name matches a charted metric (exactly, or `benchmark/<suite>`). */
  forChart(metric: string): [string, Series][] {
    return this.names()
      .filter((n) => n === metric || n.startsWith(`${metric}/`))
      .map((n) => [n, this.series.get(n)!]);
  }
}

function push(s: Series, x: number, y: number): void {
  s.x.push(x);
  s.y.push(y);
  s.lo.push(y);
  s.hi.push(y);
}

/**
 * Align several series on the union of their x values (uPlot wants one x array);
 * a series has null where it has no point.
 */
export function alignByX(list: { x: number[]; y: number[] }[]): [number[], ...(number | null)[][]] {
  const xs = [...new Set(list.flatMap((s) => s.x))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = list.map((s) => {
    const out = new Array<number | null>(xs.length).fill(null);
    s.x.forEach((x, i) => (out[index.get(x)!] = s.y[i]));
    return out;
  });
  return [xs, ...ys];
}
