import { describe, expect, it } from "vitest";
import { RunStream, SeqCursor } from "../lib/cursor";
import type { RunEvent } from "../lib/types";
import { ev } from "./events";

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

class FakeSocket {
  static all: FakeSocket[] = [];
  sent: unknown[] = [];
  readyState = 0;
  onopen: ((ev: Event) => void) | null = null;
  onclose: ((ev: CloseEvent) => void) | null = null;
  onmessage: ((ev: MessageEvent) => void) | null = null;
  constructor(readonly url: string) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    this.sent.push(JSON.parse(data));
  }
  close() {
    this.onclose?.({} as CloseEvent);
  }
  open() {
    this.readyState = 1;
    this.onopen?.({} as Event);
  }
  deliver(run: number, events: RunEvent[]) {
    this.onmessage?.({ data: JSON.stringify({ type: "events", run, events }) } as MessageEvent);
  }
  drop() {
    this.onclose?.({} as CloseEvent);
  }
}

function stream(got: RunEvent[]) {
  FakeSocket.all = [];
  return new RunStream(5, {
    url: "ws://test/ws/",
    retryMs: 0,
    onEvents: (e) => got.push(...e),
    makeSocket: (u) => new FakeSocket(u),
  });
}

describe("RunStream", () => {
  it("resubscribes after the last seq it saw when the socket comes back", async () => {
    const got: RunEvent[] = [];
    const s = stream(got);
    s.start();
    FakeSocket.all[0].open();
    expect(FakeSocket.all[0].sent).toEqual([{ type: "subscribe", run: 5, after: 0 }]);
    FakeSocket.all[0].deliver(5, batch(1, 2, 3));
    FakeSocket.all[0].drop();
    await new Promise((r) => setTimeout(r, 5));
    expect(FakeSocket.all).toHaveLength(2);
    FakeSocket.all[1].open();
    expect(FakeSocket.all[1].sent).toEqual([{ type: "subscribe", run: 5, after: 3 }]);
    FakeSocket.all[1].deliver(5, batch(3, 4)); // an overlap is not shown twice
    expect(got.map((e) => e.seq)).toEqual([1, 2, 3, 4]);
    s.stop();
  });

  it("holds events while paused and releases them in order", () => {
    const got: RunEvent[] = [];
    const s = stream(got);
    s.start();
    FakeSocket.all[0].open();
    FakeSocket.all[0].deliver(5, batch(1));
    s.setPaused(true);
    FakeSocket.all[0].deliver(5, batch(2, 3));
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
    ws.deliver(6, batch(1));
    ws.deliver(5, batch(1, 3));
    expect(got.map((e) => e.seq)).toEqual([1]);
    expect(ws.sent.at(-1)).toEqual({ type: "subscribe", run: 5, after: 1 });
    s.stop();
  });
});
