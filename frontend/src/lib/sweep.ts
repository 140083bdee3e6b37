// Sweeps (GET /api/sweeps/{id}/): the rows of the compare page's sweep table, their
// sorting, and the launch form's values ("1e-4, 3e-4" -> [0.0001, 0.0003]).

export interface SweepRunRow {
  run: number;
  index: number;
  name: string;
  values: Record<string, unknown>;
  status: string;
  launched: boolean; // a queued run not launched yet waits for a slot under the cap
  step: number;
  steps: number;
  benchmark_step: number | null;
  benchmark: Record<string, number>;
  score: number | null;
  metrics: Record<string, number>;
}

export interface Sweep {
  id: number;
  experiment: number;
  name: string;
  mode: "grid" | "random";
  params: Record<string, unknown>;
  samples: number;
  seed: number;
  max_concurrent: number;
  status: "running" | "finished" | "cancelled";
  run_count: number;
  created_at: string;
  cancelled_at: string | null;
  runs?: SweepRunRow[];
}

/** A column of the table: a swept field ("values.train.lr"), "score", "status", "index",
 *  or a metric's last value ("metric:loss"). */
export type SortKey = string;
export interface Sort {
  key: SortKey;
  dir: "asc" | "desc";
}

export function cell(row: SweepRunRow, key: SortKey): unknown {
  if (key.startsWith("values.")) return row.values[key.slice("values.".length)];
  if (key.startsWith("metric:")) return row.metrics[key.slice("metric:".length)];
  if (key === "score") return row.score;
  if (key === "status") return row.status;
  if (key === "run") return row.run;
  return row.index;
}

function compare(a: unknown, b: unknown): number {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

/** Rows sorted by one column; a row without a value (no benchmark yet) sorts last in
 *  both directions, and ties keep the sweep's order. */
export function sortRows(rows: SweepRunRow[], sort: Sort): SweepRunRow[] {
  const sign = sort.dir === "asc" ? 1 : -1;
  return [...rows].sort((x, y) => {
    const a = cell(x, sort.key);
    const b = cell(y, sort.key);
    const missA = a === null || a === undefined;
    const missB = b === null || b === undefined;
    if (missA || missB) return missA === missB ? x.index - y.index : missA ? 1 : -1;
    return sign * compare(a, b) || x.index - y.index;
  });
}

/** Clicking a header: the same column flips its direction, a new one starts descending
 *  for scores and metrics (best first) and ascending otherwise. */
export function nextSort(current: Sort | null, key: SortKey): Sort {
  if (current?.key === key) return { key, dir: current.dir === "asc" ? "desc" : "asc" };
  const scoreLike = key === "score" || key.startsWith("metric:");
  return { key, dir: scoreLike ? "desc" : "asc" };
}

/** "1e-4, 3e-4, elastic, true" -> [0.0001, 0.0003, "elastic", true]. */
export function parseValues(text: string): unknown[] {
  return text
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "")
    .map((s) => {
      if (s === "true" || s === "false") return s === "true";
      const n = Number(s);
      return Number.isFinite(n) ? n : s;
    });
}

/** The swept field paths of a sweep's rows, in the order of its spec. */
export function sweptFields(sweep: Sweep): string[] {
  return Object.keys(sweep.params);
}

/** The metrics every row has a value for (candidates for the table's extra column). */
export function commonMetrics(rows: SweepRunRow[]): string[] {
  if (!rows.length) return [];
  const names = Object.keys(rows[0].metrics);
  return names.filter((n) => rows.every((r) => n in r.metrics)).sort();
}

export interface ParamRow {
  field: string;
  values: string; // "1e-4, 3e-4" (choices) or, random only, "1e-5 .. 1e-3" (a range)
  log: boolean;
}

const RANGE = /^\s*([-+0-9.eE]+)\s*\.\.\s*([-+0-9.eE]+)\s*$/;

/** The API's `params` from the form's rows (rows without a field are left out). */
export function buildParams(rows: ParamRow[], mode: "grid" | "random"): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const row of rows) {
    const field = row.field.trim();
    if (!field) continue;
    const range = mode === "random" ? RANGE.exec(row.values) : null;
    if (range) {
      const spec: Record<string, unknown> = { low: Number(range[1]), high: Number(range[2]) };
      if (row.log) spec.log = true;
      out[field] = spec;
    } else out[field] = parseValues(row.values);
  }
  return out;
}

/** An error answer of POST /api/sweeps/ as lines "field: message". */
export function errorLines(body: unknown): string[] {
  if (!body || typeof body !== "object") return [String(body)];
  const lines: string[] = [];
  for (const [key, value] of Object.entries(body as Record<string, unknown>)) {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      for (const [sub, msgs] of Object.entries(value as Record<string, unknown>))
        lines.push(`${key}.${sub}: ${([] as unknown[]).concat(msgs).join("; ")}`);
    } else lines.push(`${key}: ${([] as unknown[]).concat(value).join("; ")}`);
  }
  return lines;
}
