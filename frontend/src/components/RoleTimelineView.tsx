// Swimlanes, one per unit, coloured by role, drawn on a canvas (cheap for long runs);
// below them the share of GPUs in each role over time.

import { useEffect, useMemo, useRef } from "react";
import { ROLE_COLORS, type RoleTimeline } from "../lib/roles";
import { ROLES } from "../lib/types";
import { Chart } from "./Chart";

const LANE = 16;
const SHARE_COLORS = ROLES.map((r) => (r === "idle" ? "#8a919c" : ROLE_COLORS[r]));

export function RoleTimelineView({
  timeline,
  showShares = true,
  span,
}: {
  timeline: RoleTimeline;
  version: number;
  showShares?: boolean;
  span?: number; // seconds the width stands for (to line several runs up); default its own
}) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const units = timeline.units();

  useEffect(() => {
    const c = canvas.current;
    if (!c) return;
    const width = c.parentElement?.clientWidth || 600;
    const labelW = 60;
    c.width = width;
    c.height = Math.max(1, units.length) * LANE + 4;
    const g = c.getContext("2d");
    if (!g) return; // jsdom
    g.clearRect(0, 0, c.width, c.height);
    const scale = (width - labelW - 4) / Math.max(span ?? timeline.tMax, 1e-9);
    g.font = "11px sans-serif";
    units.forEach((unit, row) => {
      const y = row * LANE + 2;
      g.fillStyle = "#333";
      g.fillText(`unit ${unit}`, 2, y + LANE - 4);
      for (const seg of timeline.lanes.get(unit) ?? []) {
        const x0 = labelW + seg.start * scale;
        const x1 = labelW + (seg.end ?? timeline.tMax) * scale;
        g.fillStyle = ROLE_COLORS[seg.role];
        g.fillRect(x0, y, Math.max(1, x1 - x0), LANE - 3);
      }
    });
  });

  const shares = timeline.shares();
  const data = useMemo(
    () => [shares.t, ...ROLES.map((r) => shares.share[r])] as [number[], ...number[][]],
    [shares],
  );

  return (
    <div className="role-timeline" data-testid="role-timeline" data-units={units.length}>
      <div className="legend">
        {ROLES.map((r) => (
          <span key={r}>
            <i style={{ background: ROLE_COLORS[r] }} /> {r}
          </span>
        ))}
      </div>
      {units.length === 0 ? <p className="muted">no role changes yet</p> : <canvas className="lanes" ref={canvas} />}
      {showShares && shares.t.length > 0 && (
        <Chart title="share of GPUs by role" labels={ROLES} data={data} xLabel="t (s)" stepped height={140} colors={SHARE_COLORS} />
      )}
    </div>
  );
}
