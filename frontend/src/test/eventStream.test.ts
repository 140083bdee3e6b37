import { describe, expect, it } from "vitest";
import { EventStream, SeqCursor } from "../lib/eventStream";
import type { RunEvent } from "../lib/types";
import { ev } from "./events";
import { FakeSocket } from "./fakeSocket";

const batch = (...seqs: number[]) => seqs.map((s) => ev("run_status", s, { status: "running" }, s));

describe("SeqCursor", () => {
  it("accepts each seq once, in order", () => {
    const c = new SeqCursor();
    expect(c.accept(batch(2, 1)).fresh.map((e) => e.seq)).toEqual([1, 2]);
    expect(c.accept(batch(1, 2, 3)).fresh.map((e) => e.seq)).toEqual([3]);
    expect(c.last).toBe(3);
  });

  it("stops at a gap and says so", () => {
    const c = new SeqCursor(3);
    const { fresh, gap } = c.accept(batch(4, 6, 7));
    expect(fresh.map((e) => e.seq)).toEqual([4]);
    expect(gap).toBe(true);
    expect(c.last).toBe(4);
  });
});

function deliver(ws: FakeSocket, run: number, events: RunEvent[]) {
  ws.message({ type: "events", run, events });
}

function stream(got: RunEvent[]) {
  FakeSocket.all = [];
  return new EventStream<RunEvent>({ run: 5 }, {
    url: "ws://test/ws/",
    retryMs: 0,
    onEvents: (e) => got.push(...e),
    makeSocket: (u) => new FakeSocket(u),
  });
}

describe("EventStream of a run", () => {
  it("resubscribes after the last seq it saw when the socket comes back", async () => {
    const got: RunEvent[] = [];
    const s = stream(got);
    s.start();
    FakeSocket.all[0].open();
    expect(FakeSocket.all[0].sent).toEqual([{ type: "subscribe", run: 5, after: 0 }]);
    deliver(FakeSocket.all[0], 5, batch(1, 2, 3));
    FakeSocket.all[0].drop();
    await new Promise((r) => setTimeout(r, 5));
    expect(FakeSocket.all).toHaveLength(2);
    FakeSocket.all[1].open();
    expect(FakeSocket.all[1].sent).toEqual([{ type: "subscribe", run: 5, after: 3 }]);
    deliver(FakeSocket.all[1], 5, batch(3, 4)); // an overlap is not shown twice
    expect(got.map((e) => e.seq)).toEqual([1, 2, 3, 4]);
    s.stop();
  });

  it("holds events while paused and releases them in order", () => {
    const got: RunEvent[] = [];
    const s = stream(got);
    s.start();
    FakeSocket.all[0].open();
    deliver(FakeSocket.all[0], 5, batch(1));
    s.setPaused(true);
    deliver(FakeSocket.all[0], 5, batch(2, 3));
    expect(got.map((e) => e.seq)).toEqual([1]);
    expect(s.cursor.last).toBe(3); // the cursor advances while paused
    s.setPaused(false);
    expect(got.map((e) => e.seq)).toEqual([1, 2, 3]);
    s.stop();
  });

  it("ignores other runs' events and asks again after a gap", () => {
    const got: RunEvent[] = [];
    const s = stream(got);
    s.start();
    const ws = FakeSocket.all[0];
    ws.open();
    deliver(ws, 6, batch(1));
    deliver(ws, 5, batch(1, 3));
    expect(got.map((e) => e.seq)).toEqual([1]);
    expect(ws.sent.at(-1)).toEqual({ type: "subscribe", run: 5, after: 1 });
    s.stop();
  });
});

describe("EventStream of a named stream", () => {
  it("subscribes by name, takes only its stream's events and errors", () => {
    FakeSocket.all = [];
    const got: number[] = [];
    const states: string[] = [];
    const s = new EventStream<RunEvent>(
      { stream: "cluster" },
      {
        url: "ws://test/ws/",
        retryMs: 0,
        onEvents: (e) => got.push(...e.map((x) => x.seq)),
        onState: (st) => states.push(st),
        makeSocket: (u) => new FakeSocket(u),
      },
    );
    s.start();
    const ws = FakeSocket.all[0];
    ws.open();
    expect(ws.sent).toEqual([{ type: "subscribe", stream: "cluster", after: 0 }]);
    deliver(ws, 5, batch(1)); // a run's events, not the cluster's
    s.handle(ws, { type: "events", stream: "cluster", events: batch(1, 2) });
    expect(got).toEqual([1, 2]);
    s.handle(ws, { type: "error", run: 5, error: "another topic's" });
    expect(states.at(-1)).toBe("live");
    s.handle(ws, { type: "error", error: "the socket's" });
    expect(states.at(-1)).toBe("closed");
    s.stop();
  });
});
