// Compare runs: metrics overlaid by step (server-aligned), role timelines stacked.

import { useEffect, useMemo, useState } from "react";
import { useSearchParams } from "react-router-dom";
import { Chart } from "../components/Chart";
import { RoleTimelineView } from "../components/RoleTimelineView";
import { api } from "../lib/api";
import { alignByX, CHARTED } from "../lib/metrics";
import { RoleTimeline } from "../lib/roles";
import type { MetricsResponse, RunEvent } from "../lib/types";

export function ComparePage() {
  const [params, setParams] = useSearchParams();
  const ids = (params.get("runs") ?? "").split(",").map(Number).filter((n) => n > 0);
  const [input, setInput] = useState(ids.join(","));
  const [metrics, setMetrics] = useState<MetricsResponse | null>(null);
  const [timelines, setTimelines] = useState<[number, RoleTimeline][]>([]);
  const [error, setError] = useState("");
  const key = ids.join(",");

  useEffect(() => {
    if (!key) return;
    setError("");
    api<MetricsResponse>(`/api/runs/metrics/?runs=${key}&points=500`)
      .then(setMetrics)
      .catch((e) => setError(String(e)));
    Promise.all(
      key.split(",").map(async (id) => {
        const tl = new RoleTimeline();
        const resp = await api<{ events: RunEvent[] }>(`/api/runs/${id}/events/?limit=10000`);
        resp.events.forEach((ev) => tl.apply(ev));
        return [Number(id), tl] as [number, RoleTimeline];
      }),
    )
      .then(setTimelines)
      .catch((e) => setError(String(e)));
  }, [key]);

  const span = Math.max(1e-9, ...timelines.map(([, tl]) => tl.tMax));
  const charts = useMemo(() => {
    if (!metrics) return [];
    const names = [...new Set(metrics.series.map((s) => s.name))].sort(
      (a, b) => (CHARTED.indexOf(a) + 1 || 99) - (CHARTED.indexOf(b) + 1 || 99) || a.localeCompare(b),
    );
    return names.map((name) => {
      const series = metrics.series.filter((s) => s.name === name);
      return {
        name,
        labels: series.map((s) => `run ${s.run}`),
        data: alignByX(series.map((s) => ({ x: s.points.map((p) => p.step), y: s.points.map((p) => p.last) }))),
      };
    });
  }, [metrics]);

  return (
    <div>
      <h2>Compare runs</h2>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          setParams({ runs: input });
        }}
      >
        run ids <input value={input} onChange={(e) => setInput(e.target.value)} placeholder="1,2,3" /> <button>compare</button>
      </form>
      {error && <p className="error">{error}</p>}
      <h3>Metrics by step</h3>
      <div className="grid">
        {charts.map((c) => (
          <Chart key={c.name} title={c.name} labels={c.labels} data={c.data} />
        ))}
      </div>
      <h3>GPU role timelines (one time scale)</h3>
      {timelines.map(([id, tl]) => (
        <div key={id} data-testid={`compare-timeline-${id}`}>
          <h4>
            run {id} · {tl.tMax.toFixed(0)} s
          </h4>
          <RoleTimelineView timeline={tl} version={0} showShares={false} span={span} />
        </div>
      ))}
    </div>
  );
}
