// Compare runs: metrics overlaid by step (server-aligned) or by wall time (each step at the
// run-clock time of its `step_finished`, lib/wallTime), role timelines stacked, each read
// from the run's stored role intervals (GET /api/runs/{id}/roles/). While a compared run is
// live the metrics (and step times) refresh every few seconds; a zoomed chart stays zoomed.
// ?sweep=ID compares a sweep's runs, with its table of swept fields and scores on top.

import { useEffect, useMemo, useRef, useState } from "react";
import { useSearchParams } from "react-router-dom";
import { Chart } from "../components/Chart";
import { RoleTimelineView } from "../components/RoleTimelineView";
import { SweepTable } from "../components/SweepTable";
import { api } from "../lib/api";
import { alignByX, CHARTED } from "../lib/metrics";
import type { Sweep } from "../lib/sweep";
import { RoleTimeline, type RoleIntervals } from "../lib/roles";
import { ROLES, type MetricsResponse, type Run } from "../lib/types";
import { bucketsByTime, fetchStepTimes, timeUnit, type StepTimes } from "../lib/wallTime";

interface Compared {
  id: number;
  timeline: RoleTimeline;
  roles: RoleIntervals;
}

interface Clock {
  key: string;
  runs: Map<number, { times: StepTimes; cursor: number }>;
}

const ACTIVE = ["queued", "starting", "running"];
const REFRESH_MS = 5000;

async function anyLive(ids: string[]): Promise<boolean> {
  const runs = await Promise.all(ids.map((id) => api<Run>(`/api/runs/${id}/`)));
  return runs.some((r) => ACTIVE.includes(r.status));
}

export function ComparePage() {
  const [params, setParams] = useSearchParams();
  const sweepId = params.get("sweep");
  const [sweep, setSweep] = useState<Sweep | null>(null);
  const listed = (params.get("runs") ?? "").split(",").map(Number).filter((n) => n > 0);
  const ids = listed.length || !sweep ? listed : (sweep.runs ?? []).map((r) => r.run);
  const byTime = params.get("x") === "time";
  const [input, setInput] = useState(ids.join(","));
  const [metrics, setMetrics] = useState<MetricsResponse | null>(null);
  const [timelines, setTimelines] = useState<Compared[]>([]);
  const [error, setError] = useState("");
  const [live, setLive] = useState(false);
  const [tick, setTick] = useState(0);
  const clock = useRef<Clock>({ key: "", runs: new Map() });
  const [clockVersion, setClockVersion] = useState(0);
  const key = ids.join(",");

  useEffect(() => {
    if (!sweepId) return setSweep(null);
    let current = true;
    api<Sweep>(`/api/sweeps/${sweepId}/`)
      .then((s) => current && setSweep(s))
      .catch((e) => current && setError(String(e)));
    return () => {
      current = false;
    };
  }, [sweepId, tick]);
  const cancelSweep = () =>
    void api<Sweep>(`/api/sweeps/${sweepId}/cancel/`, { method: "POST" })
      .then(setSweep)
      .catch((e) => setError(String(e)));

  useEffect(() => {
    if (!key) return;
    setError("");
    Promise.all(
      key.split(",").map(async (id) => {
        const roles = await api<RoleIntervals>(`/api/runs/${id}/roles/`);
        return { id: Number(id), timeline: RoleTimeline.fromIntervals(roles), roles };
      }),
    )
      .then(setTimelines)
      .catch((e) => setError(String(e)));
  }, [key]);

  // Metrics (and whether to keep refreshing them): on load, then on every refresh tick.
  useEffect(() => {
    if (!key) return;
    let current = true;
    api<MetricsResponse>(`/api/runs/metrics/?runs=${key}&points=500`)
      .then((m) => current && setMetrics(m))
      .catch((e) => current && setError(String(e)));
    anyLive(key.split(","))
      .then((l) => current && setLive(l))
      .catch(() => current && setLive(false));
    return () => {
      current = false;
    };
  }, [key, tick]);

  useEffect(() => {
    if (!live) return;
    const timer = setInterval(() => setTick((t) => t + 1), REFRESH_MS);
    return () => clearInterval(timer);
  }, [live]);

  // Step times, read only in wall-time mode, after each run's last seen event.
  useEffect(() => {
    if (!key || !byTime) return;
    if (clock.current.key !== key) clock.current = { key, runs: new Map() };
    const mine = clock.current;
    let current = true;
    Promise.all(
      key.split(",").map(async (raw) => {
        const run = Number(raw);
        const entry = mine.runs.get(run) ?? { times: new Map(), cursor: 0 };
        mine.runs.set(run, entry);
        entry.cursor = await fetchStepTimes(run, entry.times, entry.cursor);
      }),
    )
      .then(() => current && clock.current === mine && setClockVersion((v) => v + 1))
      .catch((e) => current && setError(String(e)));
    return () => {
      current = false;
    };
  }, [key, byTime, tick]);

  const span = Math.max(1e-9, ...timelines.map((c) => c.timeline.tMax));
  const xAxis = useMemo(() => {
    if (!byTime) return { label: "step", seconds: 1 };
    let max = 0;
    for (const { times } of clock.current.runs.values()) for (const t of times.values()) max = Math.max(max, t);
    return timeUnit(max);
    // eslint-disable-next-line react-hooks/exhaustive-deps -- clockVersion marks a change of the ref
  }, [byTime, clockVersion]);
  const charts = useMemo(() => {
    if (!metrics) return [];
    const names = [...new Set(metrics.series.map((s) => s.name))].sort(
      (a, b) => (CHARTED.indexOf(a) + 1 || 99) - (CHARTED.indexOf(b) + 1 || 99) || a.localeCompare(b),
    );
    const runs = clock.current.runs;
    return names.map((name) => {
      const series = metrics.series.filter((s) => s.name === name);
      const xy = series.map((s) => {
        if (!byTime) return { x: s.points.map((p) => p.step), y: s.points.map((p) => p.last) };
        const { x, y } = bucketsByTime(s.points, runs.get(s.run)?.times ?? new Map());
        return { x: x.map((t) => t / xAxis.seconds), y };
      });
      return { name, labels: series.map((s) => `run ${s.run}`), data: alignByX(xy) };
    });
    // eslint-disable-next-line react-hooks/exhaustive-deps -- clockVersion marks a change of the ref
  }, [metrics, byTime, xAxis, clockVersion]);

  const setX = (mode: "step" | "time") => {
    const next = new URLSearchParams(params);
    if (mode === "time") next.set("x", "time");
    else next.delete("x");
    setParams(next);
  };

  return (
    <div>
      <h2>Compare runs</h2>
      {sweep && <SweepTable sweep={sweep} onCancel={cancelSweep} />}
      <form
        onSubmit={(e) => {
          e.preventDefault();
          setParams(byTime ? { runs: input, x: "time" } : { runs: input });
        }}
      >
        run ids <input value={input} onChange={(e) => setInput(e.target.value)} placeholder="1,2,3" /> <button>compare</button>
      </form>
      {error && <p className="error">{error}</p>}
      <h3>
        Metrics by {byTime ? "wall time" : "step"}{" "}
        <span className="muted" data-testid="compare-x">
          x:{" "}
          <label>
            <input type="radio" name="compare-x" checked={!byTime} onChange={() => setX("step")} /> step
          </label>{" "}
          |{" "}
          <label>
            <input type="radio" name="compare-x" checked={byTime} onChange={() => setX("time")} /> wall time
          </label>
          {live ? " · live" : ""}
        </span>
      </h3>
      {byTime && <p className="note">each step at its run-clock time (step_finished); steps not finished yet are left out</p>}
      <div className="grid">
        {charts.map((c) => (
          <Chart key={c.name} title={c.name} labels={c.labels} data={c.data} xLabel={xAxis.label} />
        ))}
      </div>
      <h3>GPU role timelines (one time scale)</h3>
      {timelines.map(({ id, timeline, roles }) => (
        <div key={id} data-testid={`compare-timeline-${id}`}>
          <h4>
            run {id} · {timeline.tMax.toFixed(0)} s ·{" "}
            <span className="muted" data-testid={`compare-shares-${id}`}>
              {ROLES.map((r) => `${r} ${(100 * roles.shares[r]).toFixed(0)}%`).join(" · ")} of GPU-seconds
            </span>
          </h4>
          {roles.truncated && (
            <p className="note">showing the first {roles.intervals.length} role intervals; the shares count them all</p>
          )}
          <RoleTimelineView timeline={timeline} version={0} showShares={false} span={span} />
        </div>
      ))}
    </div>
  );
}
