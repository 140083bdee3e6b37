// Per-unit system metrics from `sys_metrics` events (real runs, every cluster.sysmetrics_s):
// CPU %, resident memory and, where NVML answered, GPU utilisation and memory. Charted on
// the run's clock (t), the x axis of the role timeline.

import type { RunEvent } from "./types";

export const SYS_METRICS = ["cpu_pct", "rss_mb", "gpu_util_pct", "gpu_mem_mb"] as const;
export type SysMetric = (typeof SYS_METRICS)[number];

export const SYS_METRIC_TITLES: Record<SysMetric, string> = {
  cpu_pct: "CPU % (100 = one core)",
  rss_mb: "memory (RSS, MB)",
  gpu_util_pct: "GPU utilisation %",
  gpu_mem_mb: "GPU memory (MB)",
};

export interface Sample {
  t: number;
  values: Partial<Record<SysMetric, number>>;
}

const MAX_SAMPLES = 20000; // per unit: beyond it every other sample is dropped
export const MAX_POINTS = 600; // x points a chart draws at most (samples are binned)

function num(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

/** The metrics one `sys_metrics` event carries (GPU ones only when its `gpu` has them). */
export function sampleOf(ev: RunEvent): Sample {
  const gpu = (ev.data.gpu ?? {}) as Record<string, unknown>;
  const values: Partial<Record<SysMetric, number>> = {};
  const pairs: [SysMetric, unknown][] = [
    ["cpu_pct", ev.data.cpu_pct],
    ["rss_mb", ev.data.rss_mb],
    ["gpu_util_pct", gpu.util_pct],
    ["gpu_mem_mb", gpu.mem_mb],
  ];
  for (const [name, raw] of pairs) {
    const v = num(raw);
    if (v !== undefined) values[name] = v;
  }
  return { t: ev.t, values };
}

export type SeriesData = [number[], ...(number | null)[][]];

/**
 * `data` on the role timeline's x axis: x also holds 0 and `span` (the timeline's width in
 * seconds; every series null there), so a chart's x range is the timeline's [0, span].
 */
export function onAxis(data: SeriesData, span: number): SeriesData {
  const [x, ...ys] = data;
  if (!x.length) return data;
  const head = x[0] > 0 ? 1 : 0;
  const tail = x[x.length - 1] < span ? 1 : 0;
  const pad = (v: (number | null)[]) => [...(head ? [null] : []), ...v, ...(tail ? [null] : [])];
  return [[...(head ? [0] : []), ...x, ...(tail ? [span] : [])], ...ys.map(pad)];
}

export class SysMetricsStore {
  readonly units = new Map<number, Sample[]>();
  readonly present = new Set<SysMetric>(); // metrics some event carried
  changes = 0;

  /** Apply one event; returns true when it was a system metrics sample. */
  apply(ev: RunEvent): boolean {
    if (ev.kind !== "sys_metrics") return false;
    const unit = Number(ev.data.unit);
    if (!Number.isInteger(unit) || !Number.isFinite(ev.t)) return false;
    let samples = this.units.get(unit);
    if (!samples) this.units.set(unit, (samples = []));
    const s = sampleOf(ev);
    for (const name of Object.keys(s.values)) this.present.add(name as SysMetric);
    samples.push(s);
    if (samples.length > MAX_SAMPLES) this.units.set(unit, samples.filter((_, i) => i % 2 === 0));
    this.changes++;
    return true;
  }

  unitIds(): number[] {
    return [...this.units.keys()].sort((a, b) => a - b);
  }

  /** The metrics to chart: CPU and memory, and the GPU ones when any unit reported them. */
  metrics(): SysMetric[] {
    return SYS_METRICS.filter((m) => this.present.has(m));
  }

  /**
   * One chart's data: x the run clock, one series per unit (unitIds order). Samples fall
   * into at most `maxPoints` bins of equal width over [0, the last sample's t]; a bin holds
   * the mean of a unit's samples in it (null where it has none), at the bins' mean t.
   */
  series(metric: SysMetric, maxPoints = MAX_POINTS): SeriesData {
    const units = this.unitIds();
    let tMax = 0;
    for (const samples of this.units.values()) for (const s of samples) tMax = Math.max(tMax, s.t);
    const width = tMax > 0 ? tMax / maxPoints : 1;
    const bins = new Map<number, { tSum: number; n: number; sums: number[]; counts: number[] }>();
    units.forEach((unit, col) => {
      for (const s of this.units.get(unit) ?? []) {
        const v = s.values[metric];
        if (v === undefined) continue;
        const key = Math.min(maxPoints - 1, Math.floor(s.t / width));
        let bin = bins.get(key);
        if (!bin) {
          bin = { tSum: 0, n: 0, sums: units.map(() => 0), counts: units.map(() => 0) };
          bins.set(key, bin);
        }
        bin.tSum += s.t;
        bin.n++;
        bin.sums[col] += v;
        bin.counts[col]++;
      }
    });
    const keys = [...bins.keys()].sort((a, b) => a - b);
    const x = keys.map((k) => bins.get(k)!.tSum / bins.get(k)!.n);
    const ys = units.map((_, col) =>
      keys.map((k) => {
        const b = bins.get(k)!;
        return b.counts[col] ? b.sums[col] / b.counts[col] : null;
      }),
    );
    return [x, ...ys];
  }
}
