// In-flight rollouts (virtualized, with progress bars) and the distribution of finished
// rollout durations, timeouts marked.

import { useVirtualizer } from "@tanstack/react-virtual";
import { useRef } from "react";
import type { RolloutTracker } from "../lib/rollouts";

export function RolloutPanel({ tracker }: { tracker: RolloutTracker; version: number }) {
  const running = tracker.running();
  const hist = tracker.histogram(20);
  const maxCount = Math.max(1, ...hist.counts);
  const scroller = useRef<HTMLDivElement>(null);
  const rows = useVirtualizer({
    count: running.length,
    getScrollElement: () => scroller.current,
    estimateSize: () => 24,
    overscan: 10,
  });
  return (
    <div className="rollouts" data-testid="rollout-progress">
      <p>
        in flight: <b data-testid="inflight-count">{running.length}</b> · finished:{" "}
        <b data-testid="finished-count">{tracker.durations.length}</b>
        {Object.entries(tracker.statusCounts).map(([s, n]) => (
          <span key={s} className="badge">
            {s} {n}
          </span>
        ))}
      </p>
      {running.length === 0 && <p className="muted">no rollout in flight</p>}
      <div className="scroll" ref={scroller} style={{ height: running.length ? 180 : 0 }}>
        <div style={{ height: rows.getTotalSize(), position: "relative" }}>
          {rows.getVirtualItems().map((v) => {
            const r = running[v.index];
            return (
              <div key={r.id} className="rollout-row" style={{ transform: `translateY(${v.start}px)` }}>
                <span className="rid">{r.id}</span>
                <span className="bar">
                  <span style={{ width: `${Math.round(r.progress * 100)}%` }} />
                </span>
                <span>{r.turns} turns</span>
                <span>{r.tokens.toLocaleString()} tok</span>
                <span>{r.elapsed.toFixed(0)} s</span>
              </div>
            );
          })}
        </div>
      </div>
      {tracker.recent.length > 0 && (
        <details>
          <summary>last {Math.min(20, tracker.recent.length)} finished</summary>
          <table data-testid="recent-rollouts">
            <thead>
              <tr>
                <th>rollout</th>
                <th>group</th>
                <th>status</th>
                <th>progress</th>
                <th>reward</th>
                <th>turns</th>
                <th>tokens</th>
                <th>duration</th>
              </tr>
            </thead>
            <tbody>
              {tracker.recent.slice(-20).reverse().map((r) => (
                <tr key={r.id}>
                  <td>{r.id}</td>
                  <td>{r.groupId}</td>
                  <td>{r.status}</td>
                  <td>{(r.progress * 100).toFixed(0)}%</td>
                  <td>{r.reward.toFixed(2)}</td>
                  <td>{r.turns}</td>
                  <td>{r.tokens.toLocaleString()}</td>
                  <td>{r.duration.toFixed(0)} s</td>
                </tr>
              ))}
            </tbody>
          </table>
        </details>
      )}
      <h4>durations (run clock)</h4>
      <div className="hist" data-testid="duration-histogram">
        {hist.counts.map((n, i) => (
          <div
            key={i}
            title={`${hist.edges[i].toFixed(0)}–${hist.edges[i + 1].toFixed(0)} s: ${n} (${hist.timeouts[i]} timed out)`}
            style={{ height: `${(100 * n) / maxCount}%` }}
          >
            <div className="timeout" style={{ height: n ? `${(100 * hist.timeouts[i]) / n}%` : 0 }} />
          </div>
        ))}
      </div>
      {hist.edges.length > 0 && (
        <p className="muted">
          {hist.edges[0].toFixed(0)} s … {hist.edges[hist.edges.length - 1].toFixed(0)} s · red = timed out
        </p>
      )}
    </div>
  );
}
