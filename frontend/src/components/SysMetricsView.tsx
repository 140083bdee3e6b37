// Each unit's CPU, memory and (where NVML answered) GPU utilisation and memory, one small
// chart per metric with a line per unit, on the role timeline's x axis (the run's clock).

import { useMemo } from "react";
import { SYS_METRIC_TITLES, onAxis, type SysMetricsStore } from "../lib/sysmetrics";
import { Chart } from "./Chart";

export function SysMetricsView({ store, span }: { store: SysMetricsStore; version: number; span: number }) {
  const units = store.unitIds();
  const metrics = store.metrics();
  // Binning reads every sample: only when samples arrived; the axis follows the clock.
  const binned = useMemo(
    () => metrics.map((m) => ({ metric: m, data: store.series(m) })),
    // eslint-disable-next-line react-hooks/exhaustive-deps -- the store mutates in place
    [store, store.changes],
  );
  const charts = useMemo(() => binned.map((c) => ({ ...c, data: onAxis(c.data, span) })), [binned, span]);
  if (units.length === 0) return null;
  const labels = units.map((u) => `unit ${u}`);
  return (
    <div className="sys-metrics" data-testid="sys-metrics" data-units={units.length} data-metrics={metrics.join(",")}>
      {charts.map(({ metric, data }) => (
        <Chart key={metric} title={SYS_METRIC_TITLES[metric]} labels={labels} data={data} xLabel="t (s)" exactX />
      ))}
    </div>
  );
}
