// A uPlot line chart that takes new data without resetting the user's zoom: drag to
// zoom, double-click to reset (then it follows the data again).

import { useEffect, useRef } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { compact } from "../lib/format";

const PALETTE = ["#2f7ed8", "#e4572e", "#29a36a", "#8e44ad", "#f3a712", "#17becf", "#7f7f7f", "#bcbd22"];

export interface ChartProps {
  title: string;
  labels: string[]; // one per y series
  data: uPlot.AlignedData;
  height?: number;
  xLabel?: string;
  stepped?: boolean;
  colors?: string[];
  exactX?: boolean; // the x axis spans the data exactly (no rounding out to nice ticks)
}

export function Chart({
  title,
  labels,
  data,
  height = 180,
  xLabel = "step",
  stepped = false,
  colors = PALETTE,
  exactX = false,
}: ChartProps) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const zoomed = useRef(false);
  const key = labels.join("\u0000");

  useEffect(() => {
    const el = host.current;
    if (!el) return;
    const opts: uPlot.Options = {
      title,
      width: Math.max(200, el.clientWidth || 400),
      height,
      scales: { x: exactX ? { time: false, range: (_u, min, max) => [min, max] } : { time: false } },
      axes: [{ label: xLabel }, { size: 56, values: (_u, ticks) => ticks.map(compact) }],
      cursor: { drag: { x: true, y: false } },
      series: [
        { label: xLabel },
        ...labels.map((label, i) => ({
          label,
          stroke: colors[i % colors.length],
          width: 1.5,
          spanGaps: true,
          paths: stepped ? uPlot.paths.stepped!({ align: 1 }) : undefined,
        })),
      ],
      hooks: {
        setSelect: [
          (u) => {
            if (u.select.width > 0) zoomed.current = true;
          },
        ],
      },
    };
    const u = new uPlot(opts, data, el);
    plot.current = u;
    const reset = () => {
      zoomed.current = false;
    };
    u.over.addEventListener("dblclick", reset);
    const resize = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.destroy();
      plot.current = null;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps -- rebuilt only when the series change
  }, [key, title, height, xLabel, stepped, colors, exactX]);

  useEffect(() => {
    plot.current?.setData(data, !zoomed.current);
  }, [data]);

  return <div className="chart" ref={host} data-testid={`chart-${title}`} />;
}
