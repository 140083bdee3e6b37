import { describe, expect, it } from "vitest";
import { compact } from "../lib/format";
import { alignByX, MetricStore } from "../lib/metrics";
import { ev } from "./events";

const server = {
  bucket: 10,
  series: [
    {
      run: 7,
      name: "loss",
      points: [
        { step: 0, last_step: 9, min: 1, max: 3, last: 2 },
        { step: 10, last_step: 19, min: 0.5, max: 1.5, last: 1 },
      ],
    },
    { run: 8, name: "loss", points: [{ step: 0, last_step: 0, min: 9, max: 9, last: 9 }] },
  ],
};

describe("MetricStore", () => {
  it("keeps the server's buckets and appends only live steps after them", () => {
    const m = new MetricStore();
    m.loadServer(server, 7);
    expect(m.apply(ev("step_finished", 1, { step: 15, version: 1, metrics: { loss: 5 } }))).toBe(false);
    expect(m.apply(ev("step_finished", 2, { step: 20, version: 2, metrics: { loss: 0.8, reward: 0.3 } }))).toBe(true);
    const loss = m.series.get("loss")!;
    expect(loss.x).toEqual([0, 10, 20]);
    expect(loss.y).toEqual([2, 1, 0.8]);
    expect(loss.lo).toEqual([1, 0.5, 0.8]);
    expect(m.series.get("reward")!.y).toEqual([0.3]);
  });

  it("keeps live points past the server's range when the server answers late", () => {
    const m = new MetricStore();
    m.apply(ev("step_finished", 1, { step: 5, version: 1, metrics: { loss: 4 } }));
    m.apply(ev("step_finished", 1, { step: 25, version: 1, metrics: { loss: 0.7 } }));
    m.loadServer(server, 7);
    expect(m.series.get("loss")!.x).toEqual([0, 10, 25]);
  });

  it("names benchmark series by suite and groups them under one chart", () => {
    const m = new MetricStore();
    m.apply(ev("benchmark", 1, { step: 0, suite: "repo", score: 0.2, tasks: 8 }));
    m.apply(ev("benchmark", 2, { step: 4, suite: "coding", score: 0.4, tasks: 8 }));
    expect(m.forChart("benchmark").map(([n]) => n)).toEqual(["benchmark/coding", "benchmark/repo"]);
  });

  it("overwrites a repeated step and ignores an older one", () => {
    const m = new MetricStore();
    m.add("kl", 3, 1);
    expect(m.add("kl", 3, 2)).toBe(true);
    expect(m.add("kl", 1, 9)).toBe(false);
    expect(m.series.get("kl")!.y).toEqual([2]);
  });
});

describe("alignByX", () => {
  it("puts several series on the union of their steps with gaps as null", () => {
    expect(alignByX([{ x: [0, 2], y: [1, 3] }, { x: [1, 2], y: [5, 6] }])).toEqual([
      [0, 1, 2],
      [1, null, 3],
      [null, 5, 6],
    ]);
  });
});

describe("compact tick labels", () => {
  it("shortens large values and keeps small ones readable", () => {
    expect(compact(1_234_567)).toBe("1.23M");
    expect(compact(25_000)).toBe("25k");
    expect(compact(0.000123456)).toBe("0.0001235");
    expect(compact(-3e9)).toBe("-3G");
    expect(compact(512)).toBe("512");
  });
});
