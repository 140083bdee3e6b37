import { describe, expect, it } from "vitest";
import { SysMetricsStore, onAxis, sampleOf } from "../lib/sysmetrics";
import { ev } from "./events";

const sys = (t: number, unit: number, cpu: number, rss: number, gpu: Record<string, number> = {}) =>
  ev("sys_metrics", t, { unit, node: "n", procs: 1, cpu_pct: cpu, rss_mb: rss, gpu });

describe("SysMetricsStore", () => {
  it("keeps one series per unit and ignores other kinds", () => {
    const store = new SysMetricsStore();
    expect(store.apply(ev("role_change", 1, { unit: 0 }))).toBe(false);
    store.apply(sys(1, 1, 50, 300));
    store.apply(sys(1, 0, 90, 500));
    store.apply(sys(2, 0, 80, 510));
    store.apply(sys(2, 1, 40, 310));
    expect(store.unitIds()).toEqual([0, 1]);
    expect(store.metrics()).toEqual(["cpu_pct", "rss_mb"]); // no GPU reported: no GPU charts
    expect(store.series("cpu_pct", 10)).toEqual([
      [1, 2],
      [90, 80],
      [50, 40],
    ]);
    expect(store.series("rss_mb", 10)[2]).toEqual([300, 310]);
    // on the role timeline's axis: [0, its span], nothing drawn at the ends
    expect(onAxis(store.series("cpu_pct", 10), 6)).toEqual([
      [0, 1, 2, 6],
      [null, 90, 80, null],
      [null, 50, 40, null],
    ]);
  });

  it("adds the GPU charts when a unit reports NVML values, null for units without", () => {
    const store = new SysMetricsStore();
    store.apply(sys(5, 0, 10, 100, { util_pct: 75, mem_mb: 4096, mem_total_mb: 8192, count: 1 }));
    store.apply(sys(5, 1, 10, 100));
    expect(store.metrics()).toEqual(["cpu_pct", "rss_mb", "gpu_util_pct", "gpu_mem_mb"]);
    expect(store.series("gpu_util_pct", 10)).toEqual([[5], [75], [null]]);
    expect(store.series("gpu_mem_mb", 10)).toEqual([[5], [4096], [null]]);
  });

  it("bins long runs to at most maxPoints x values, averaging each unit within a bin", () => {
    const store = new SysMetricsStore();
    for (let t = 0; t <= 100; t += 0.5) store.apply(sys(t, 0, t, 1));
    const [x, cpu] = store.series("cpu_pct", 10);
    expect(x.length).toBe(10);
    expect(x).toEqual([...x].sort((a, b) => a - b));
    expect(cpu[0]).toBeCloseTo(4.75); // the mean of 0, 0.5, ..., 9.5
    expect(x[0]).toBeCloseTo(4.75); // placed at its samples' mean time
  });

  it("leaves the axis alone where the samples already reach its ends", () => {
    expect(onAxis([[0, 3], [1, 2]], 3)).toEqual([[0, 3], [1, 2]]);
    expect(onAxis([[], []], 3)).toEqual([[], []]);
  });

  it("skips malformed values and events", () => {
    expect(sampleOf(ev("sys_metrics", 1, { unit: 0, cpu_pct: null, rss_mb: "x" })).values).toEqual({});
    const store = new SysMetricsStore();
    expect(store.apply(ev("sys_metrics", 1, { unit: "one", cpu_pct: 1 }))).toBe(false);
    expect(store.unitIds()).toEqual([]);
  });
});
