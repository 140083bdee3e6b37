import { afterEach, describe, expect, it, vi } from "vitest";
import type { RunEvent } from "../lib/types";
import { addStepTimes, bucketsByTime, fetchStepTimes, STEP_EVENTS_PAGE, timeUnit, type StepTimes } from "../lib/wallTime";
import { ev, resetSeq } from "./events";

afterEach(() => {
  vi.unstubAllGlobals();
  resetSeq();
});

describe("step -> wall time", () => {
  it("takes each step's time from its step_finished event (a later one wins)", () => {
    const times = addStepTimes(new Map(), [
      ev("step_finished", 12.5, { step: 0 }),
      ev("run_status", 13, { status: "running", step: 1 }),
      ev("step_finished", 30, { step: 1 }),
      ev("step_finished", 31, { step: 1 }), // redone after a resume
      ev("benchmark", 40, { step: 2, suite: "s", score: 1 }),
    ]);
    expect([...times.entries()]).toEqual([
      [0, 12.5],
      [1, 31],
    ]);
  });

  it("places each bucket at the time of its last step and drops steps not finished yet", () => {
    const times: StepTimes = new Map([
      [4, 40],
      [9, 95],
      [14, 130],
    ]);
    const points = [
      { step: 0, last_step: 4, min: 1, max: 3, last: 2 },
      { step: 5, last_step: 9, min: 0, max: 1, last: 0.5 },
      { step: 10, last_step: 14, min: 0, max: 1, last: 0.25 },
      { step: 15, last_step: 19, min: 0, max: 1, last: 0.1 }, // step 19 has no step_finished yet
    ];
    expect(bucketsByTime(points, times)).toEqual({ x: [40, 95, 130], y: [2, 0.5, 0.25] });
    expect(bucketsByTime(points, new Map())).toEqual({ x: [], y: [] });
  });

  it("sorts by time when a run's clock does not follow its steps", () => {
    const times: StepTimes = new Map([
      [1, 20],
      [2, 10],
    ]);
    const points = [
      { step: 1, last_step: 1, min: 1, max: 1, last: 1 },
      { step: 2, last_step: 2, min: 2, max: 2, last: 2 },
    ];
    expect(bucketsByTime(points, times)).toEqual({ x: [10, 20], y: [2, 1] });
  });

  it("shows seconds up to an hour, minutes beyond", () => {
    expect(timeUnit(3600)).toEqual({ label: "wall time (s)", seconds: 1 });
    expect(timeUnit(7200)).toEqual({ label: "wall time (min)", seconds: 60 });
  });

  it("reads the step_finished events page by page after a cursor", async () => {
    const all: RunEvent[] = [];
    for (let step = 0; step < STEP_EVENTS_PAGE + 3; step++) all.push(ev("step_finished", 2 * step, { step }, 2 * step + 1));
    const urls: string[] = [];
    vi.stubGlobal("fetch", async (url: string) => {
      urls.push(url);
      const q = new URL(url, "http://x").searchParams;
      const after = Number(q.get("after"));
      const events = all.filter((e) => e.seq > after).slice(0, Number(q.get("limit")));
      return { ok: true, status: 200, text: async () => JSON.stringify({ run: 3, events }) };
    });
    const times: StepTimes = new Map();
    const cursor = await fetchStepTimes(3, times);
    expect(urls).toEqual([
      `/api/runs/3/events/?kind=step_finished&after=0&limit=${STEP_EVENTS_PAGE}`,
      `/api/runs/3/events/?kind=step_finished&after=${2 * STEP_EVENTS_PAGE - 1}&limit=${STEP_EVENTS_PAGE}`,
    ]);
    expect(times.size).toBe(STEP_EVENTS_PAGE + 3);
    expect(times.get(STEP_EVENTS_PAGE + 2)).toBe(2 * (STEP_EVENTS_PAGE + 2));
    expect(cursor).toBe(all[all.length - 1].seq);
    // Nothing new: one request from the cursor, which stays put.
    expect(await fetchStepTimes(3, times, cursor)).toBe(cursor);
    expect(urls[2]).toContain(`after=${cursor}`);
  });
});
