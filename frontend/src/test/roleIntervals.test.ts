import { describe, expect, it } from "vitest";
import { RoleTimeline, type RoleIntervals } from "../lib/roles";

const zero = { rollout: 0, train: 0, switching: 0, idle: 0 };

function resp(over: Partial<RoleIntervals>): RoleIntervals {
  return { run: 1, t0: 0, t1: 20, horizon: 20, units: [], intervals: [], truncated: false, gpu_seconds: zero, shares: zero, ...over };
}

describe("RoleTimeline.fromIntervals", () => {
  it("builds the lanes from stored intervals, open ones running to the run's clock", () => {
    const tl = RoleTimeline.fromIntervals(
      resp({
        units: [
          { unit: 0, gpus: 1 },
          { unit: 1, gpus: 3 },
        ],
        intervals: [
          { unit: 0, role: "rollout", start: 0, end: 10 },
          { unit: 1, role: "train", start: 0, end: 4 },
          { unit: 1, role: "rollout", start: 4, end: null },
          { unit: 0, role: "train", start: 10, end: 10 }, // zero length: dropped
          { unit: 0, role: "mystery", start: 10, end: null },
        ],
      }),
    );
    expect(tl.units()).toEqual([0, 1]);
    expect(tl.tMax).toBe(20);
    expect(tl.lanes.get(0)).toEqual([
      { role: "rollout", start: 0, end: 10 },
      { role: "idle", start: 10, end: null },
    ]);
    expect(tl.totals()).toEqual({ rollout: 10 + 16, train: 4, switching: 0, idle: 10 });
    // Shares weight each unit by its GPUs: at t=4 unit 1 (3 GPUs) is in rollout with unit 0.
    const s = tl.shares();
    expect(s.t).toEqual([0, 4, 10]);
    expect(s.share.train).toEqual([0.75, 0, 0]);
    expect(s.share.rollout).toEqual([0.25, 1, 0.75]);
  });

  it("an empty answer gives an empty timeline", () => {
    const tl = RoleTimeline.fromIntervals(resp({ horizon: 0, t1: 0 }));
    expect(tl.units()).toEqual([]);
    expect(tl.shares().t).toEqual([]);
  });
});
