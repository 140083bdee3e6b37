// The run's event log, newest last, virtualized.

import { useVirtualizer } from "@tanstack/react-virtual";
import { useRef } from "react";
import type { RunEvent } from "../lib/types";

export function EventLog({ events }: { events: RunEvent[]; version: number }) {
  const scroller = useRef<HTMLDivElement>(null);
  const rows = useVirtualizer({
    count: events.length,
    getScrollElement: () => scroller.current,
    estimateSize: () => 20,
    overscan: 20,
  });
  return (
    <div className="scroll event-log" ref={scroller} style={{ height: 220 }} data-testid="event-log">
      <div style={{ height: rows.getTotalSize(), position: "relative" }}>
        {rows.getVirtualItems().map((v) => {
          const e = events[v.index];
          return (
            <div key={e.seq} className="event-row" style={{ transform: `translateY(${v.start}px)` }}>
              <span className="seq">#{e.seq}</span>
              <span className="kind">{e.kind}</span>
              <span className="t">t={e.t.toFixed(1)}</span>
              <code>{JSON.stringify(e.data).slice(0, 160)}</code>
            </div>
          );
        })}
      </div>
    </div>
  );
}
