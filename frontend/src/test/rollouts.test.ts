import { describe, expect, it } from "vitest";
import { RolloutTracker } from "../lib/rollouts";
import { ev } from "./events";

function started(t: number, id: string) {
  return ev("rollout_started", t, { rollout_id: id, task_id: "task", group_id: "g", step: 0 });
}
function finished(t: number, id: string, status = "completed") {
  return ev("rollout_finished", t, { rollout_id: id, status, progress: 1, reward: 1, turns: 3, tokens: 90, versions: [0, 1] });
}

describe("RolloutTracker", () => {
  it("tracks in-flight rollouts with progress, turns, tokens and elapsed time", () => {
    const r = new RolloutTracker();
    r.apply(started(0, "a"));
    r.apply(started(5, "b"));
    r.apply(ev("rollout_progress", 8, { rollout_id: "a", turns: 4, tokens: 1200, progress: 0.5, branches: { compaction: 1 } }));
    const running = r.running();
    expect(running.map((x) => x.id)).toEqual(["a", "b"]);
    expect(running[0]).toMatchObject({ turns: 4, tokens: 1200, progress: 0.5, elapsed: 8 });
    expect(running[1].elapsed).toBe(3);
  });

  it("moves finished rollouts out and keeps their durations and statuses", () => {
    const r = new RolloutTracker();
    r.apply(started(0, "a"));
    r.apply(started(0, "b"));
    r.apply(finished(30, "a"));
    r.apply(finished(100, "b", "timeout"));
    expect(r.inflight.size).toBe(0);
    expect(r.durations).toEqual([30, 100]);
    expect(r.statusCounts).toEqual({ completed: 1, timeout: 1 });
    expect(r.recent[1]).toMatchObject({ id: "b", reward: 1, duration: 100 });
  });

  it("ignores progress for a rollout it never saw start", () => {
    const r = new RolloutTracker();
    expect(r.apply(ev("rollout_progress", 1, { rollout_id: "ghost", turns: 1, tokens: 1, progress: 0.1 }))).toBe(false);
    expect(r.inflight.size).toBe(0);
  });

  it("bins durations and counts timeouts per bin", () => {
    const r = new RolloutTracker();
    [10, 20, 20, 110].forEach((d, i) => {
      r.apply(started(0, `r${i}`));
      r.apply(finished(d, `r${i}`, d > 100 ? "timeout" : "completed"));
    });
    const h = r.histogram(10);
    expect(h.edges[0]).toBe(10);
    expect(h.edges[10]).toBe(110);
    expect(h.counts.reduce((a, b) => a + b, 0)).toBe(4);
    expect(h.counts[0]).toBe(1);
    expect(h.counts[1]).toBe(2);
    expect(h.counts[9]).toBe(1);
    expect(h.timeouts[9]).toBe(1);
    expect(h.timeouts.reduce((a, b) => a + b, 0)).toBe(1);
  });
});
