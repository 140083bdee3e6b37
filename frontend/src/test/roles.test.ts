import { describe, expect, it } from "vitest";
import { RoleTimeline } from "../lib/roles";
import { ev } from "./events";

const change = (t: number, unit: number, from: string, to: string, gpus = [unit]) =>
  ev("role_change", t, { unit, gpus, from_role: from, to_role: to });

describe("RoleTimeline", () => {
  it("builds one lane per unit and closes each segment at the next change", () => {
    const tl = new RoleTimeline();
    tl.apply(change(0, 1, "idle", "rollout"));
    tl.apply(change(10, 1, "rollout", "switching"));
    tl.apply(change(12, 1, "switching", "train"));
    tl.apply(change(0, 0, "idle", "train"));
    expect(tl.units()).toEqual([0, 1]);
    expect(tl.lanes.get(1)).toEqual([
      { role: "rollout", start: 0, end: 10 },
      { role: "switching", start: 10, end: 12 },
      { role: "train", start: 12, end: null },
    ]);
  });

  it("backfills the role a unit left when it is first seen after t=0", () => {
    const tl = new RoleTimeline();
    tl.apply(change(50, 3, "rollout", "train"));
    expect(tl.lanes.get(3)).toEqual([
      { role: "rollout", start: 0, end: 50 },
      { role: "train", start: 50, end: null },
    ]);
  });

  it("weights the share of GPUs per role by each unit's GPUs", () => {
    const tl = new RoleTimeline();
    tl.apply(change(0, 0, "idle", "rollout", [0, 1, 2])); // 3 GPUs
    tl.apply(change(0, 1, "idle", "train", [3])); // 1 GPU
    tl.apply(change(5, 1, "train", "rollout", [3]));
    const s = tl.shares();
    expect(s.t).toEqual([0, 5]); // changes at one instant collapse to one sample
    expect(s.share.rollout).toEqual([0.75, 1]);
    expect(s.share.train).toEqual([0.25, 0]);
  });

  it("ignores other kinds but extends open segments to the latest time", () => {
    const tl = new RoleTimeline();
    tl.apply(change(0, 0, "idle", "rollout"));
    expect(tl.apply(ev("step_finished", 40, { step: 1, metrics: {} }))).toBe(false);
    expect(tl.tMax).toBe(40);
    expect(tl.totals().rollout).toBe(40);
  });

  it("maps an unknown role to idle rather than failing", () => {
    const tl = new RoleTimeline();
    tl.apply(change(0, 0, "idle", "mystery"));
    expect(tl.lanes.get(0)![0].role).toBe("idle");
  });
});
