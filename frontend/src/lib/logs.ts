// A run's log lines (GET /api/runs/{id}/logs/): the query for a filter and cursor, and
// the lines held in the panel (by seq, no duplicates, at most KEEP of the newest).

import type { LogLevel, LogLine } from "./types";

export const KEEP = 5000; // lines the panel holds
export const PAGE = 500; // lines a request asks for

export interface LogFilter {
  q: string;
  level: LogLevel | "";
}

export function logsUrl(runId: number, filter: LogFilter, after: number): string {
  const params = new URLSearchParams({ limit: String(PAGE) });
  const q = filter.q.trim();
  if (q) params.set("q", q);
  if (filter.level) params.set("level", filter.level);
  if (after > 0) params.set("after", String(after));
  else params.set("tail", "true"); // the first read: the newest lines
  return `/api/runs/${runId}/logs/?${params.toString()}`;
}

// `held` then the lines of `page` newer than its last one, the newest KEEP.
export function mergeLines(held: LogLine[], page: LogLine[], keep = KEEP): LogLine[] {
  const top = held.length ? held[held.length - 1].seq : 0;
  const fresh = page.filter((l) => l.seq > top);
  if (!fresh.length) return held;
  const all = held.concat(fresh);
  return all.length > keep ? all.slice(all.length - keep) : all;
}

// The cursor the next read continues from.
export function lastSeq(lines: LogLine[]): number {
  return lines.length ? lines[lines.length - 1].seq : 0;
}
