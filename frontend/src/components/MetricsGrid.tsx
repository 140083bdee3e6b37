// The run's metric charts: the charted metrics first, then any other series the run has.

import { useMemo } from "react";
import { CHARTED, type MetricStore } from "../lib/metrics";
import { alignByX } from "../lib/metrics";
import { Chart } from "./Chart";

export function MetricsGrid({ store, version }: { store: MetricStore; version: number }) {
  const charts = useMemo(() => {
    const names = store.names();
    const extra = names.filter((n) => !CHARTED.some((c) => n === c || n.startsWith(`${c}/`)));
    return [...CHARTED, ...extra]
      .map((metric) => {
        const list = store.forChart(metric);
        if (!list.length) return null;
        return { metric, labels: list.map(([n]) => n), data: alignByX(list.map(([, s]) => s)) };
      })
      .filter((c) => c !== null);
    // eslint-disable-next-line react-hooks/exhaustive-deps -- the store mutates; version says when
  }, [store, version, store.version]);
  if (!charts.length) return <p className="muted">no metrics yet</p>;
  return (
    <div className="grid" data-testid="metrics">
      {charts.map((c) => (
        <Chart key={c.metric} title={c.metric} labels={c.labels} data={c.data} />
      ))}
    </div>
  );
}
