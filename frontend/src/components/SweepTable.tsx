// A sweep on the compare page: its runs as a table of the swept fields against the final
// benchmark (and, if picked, a metric's last value), sortable by any column, and a chart
// of that score per run in the order of the sweep.

import { useMemo, useState } from "react";
import { Link } from "react-router-dom";
import { commonMetrics, nextSort, sortRows, sweptFields, type Sort, type Sweep } from "../lib/sweep";
import { Chart } from "./Chart";

function show(v: unknown): string {
  if (v === null || v === undefined) return "—";
  if (typeof v === "number") return String(Number(v.toPrecision(4)));
  return String(v);
}

export function SweepTable({ sweep, onCancel }: { sweep: Sweep; onCancel?: () => void }) {
  const rows = useMemo(() => sweep.runs ?? [], [sweep]);
  const fields = sweptFields(sweep);
  const metrics = useMemo(() => commonMetrics(rows), [rows]);
  const [metric, setMetric] = useState("");
  const [sort, setSort] = useState<Sort | null>(null);
  const sorted = sort ? sortRows(rows, sort) : rows;
  const columns: [string, string][] = [
    ["index", "#"],
    ...fields.map((f): [string, string] => [`values.${f}`, f]),
    ["status", "status"],
    ["score", "final benchmark"],
    ...(metric ? [[`metric:${metric}`, `${metric} (last)`] as [string, string]] : []),
  ];
  const charted = metric ? `metric:${metric}` : "score";
  const ys = rows.map((r) => (metric ? r.metrics[metric] : r.score) ?? null);
  const arrow = (key: string) => (sort?.key === key ? (sort.dir === "asc" ? " ▲" : " ▼") : "");
  return (
    <section data-testid="sweep">
      <h3>
        {sweep.name || `sweep ${sweep.id}`}{" "}
        <span className="muted" data-testid="sweep-status">
          {sweep.status}
        </span>{" "}
        <span className="muted">
          · {sweep.mode} · {sweep.run_count} runs · at most {sweep.max_concurrent} at once
        </span>{" "}
        {onCancel && sweep.status === "running" && <button onClick={onCancel}>cancel sweep</button>}
      </h3>
      <p>
        extra column{" "}
        <select aria-label="sweep metric" value={metric} onChange={(e) => setMetric(e.target.value)}>
          <option value="">(none: chart the final benchmark)</option>
          {metrics.map((m) => (
            <option key={m} value={m}>
              {m}
            </option>
          ))}
        </select>
      </p>
      <table data-testid="sweep-table">
        <thead>
          <tr>
            {columns.map(([key, label]) => (
              <th key={key} className="sortable" onClick={() => setSort(nextSort(sort, key))} data-key={key}>
                {label}
                {arrow(key)}
              </th>
            ))}
            <th>run</th>
          </tr>
        </thead>
        <tbody>
          {sorted.map((r) => (
            <tr key={r.run} data-run={r.run}>
              <td>{r.index + 1}</td>
              {fields.map((f) => (
                <td key={f}>{show(r.values[f])}</td>
              ))}
              <td>{r.status === "queued" && !r.launched ? "waiting for a slot" : r.status}</td>
              <td title={Object.entries(r.benchmark).map(([s, v]) => `${s} ${v.toFixed(3)}`).join(", ")}>
                {show(r.score)}
                {r.benchmark_step !== null && <span className="muted"> @{r.benchmark_step}</span>}
              </td>
              {metric && <td>{show(r.metrics[metric])}</td>}
              <td>
                <Link to={`/runs/${r.run}`}>{r.name || `run ${r.run}`}</Link>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {ys.some((y) => y !== null) ? (
        <Chart
          title={`${charted === "score" ? "final benchmark" : `${metric} (last)`} by run`}
          labels={[charted === "score" ? "final benchmark" : metric]}
          data={[rows.map((r) => r.index + 1), ys]}
          xLabel="run #"
        />
      ) : (
        <p className="note" data-testid="sweep-no-scores">
          no run has a benchmark score yet{metrics.length ? ": pick a metric above to chart it" : ""}
        </p>
      )}
    </section>
  );
}
