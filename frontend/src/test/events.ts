import type { RunEvent } from "../lib/types";

let seq = 0;
export function ev(kind: string, t: number, data: Record<string, unknown>, at?: number): RunEvent {
  seq = at ?? seq + 1;
  return { seq, kind, t, wall: "2026-01-01T00:00:00Z", data };
}
export function resetSeq(): void {
  seq = 0;
}
