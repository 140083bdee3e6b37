import { describe, expect, it } from "vitest";
import { lastSeq, logsUrl, mergeLines } from "../lib/logs";
import type { LogLine } from "../lib/types";

const line = (seq: number): LogLine => ({
  seq,
  time: "2026-01-01T00:00:00Z",
  source: "runtime",
  level: "info",
  text: `line ${seq}`,
});

describe("logsUrl", () => {
  it("asks for the tail first, then continues after the cursor with the filter", () => {
    expect(logsUrl(3, { q: "", level: "" }, 0)).toBe("/api/runs/3/logs/?limit=500&tail=true");
    expect(logsUrl(3, { q: " disk full ", level: "warning" }, 42)).toBe(
      "/api/runs/3/logs/?limit=500&q=disk+full&level=warning&after=42",
    );
  });
});

describe("mergeLines", () => {
  it("appends only lines newer than those held, and keeps the newest", () => {
    const held = [line(1), line(2)];
    expect(mergeLines(held, [line(2), line(3)]).map((l) => l.seq)).toEqual([1, 2, 3]);
    expect(mergeLines(held, [line(1)])).toBe(held);
    expect(mergeLines(held, [line(3), line(4)], 3).map((l) => l.seq)).toEqual([2, 3, 4]);
    expect(lastSeq([])).toBe(0);
    expect(lastSeq(held)).toBe(2);
  });
});
