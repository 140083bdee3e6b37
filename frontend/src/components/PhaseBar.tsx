// The run's current long phase as a line and a bar: "warm start 250/1000, loss 0.412
// (target 0.12)". Nothing before the first phase_progress event.

import { latestPhase, phaseShare, phaseText } from "../lib/phase";
import type { RunEvent } from "../lib/types";

export function PhaseBar({ events }: { events: RunEvent[]; version: number }) {
  const p = latestPhase(events);
  if (!p) return null;
  const share = phaseShare(p);
  return (
    <div className="phase" data-testid="phase">
      <progress max={1} value={share} data-testid="phase-bar" />
      <span data-testid="phase-text">{phaseText(p)}</span>
      {share >= 1 && <span className="muted"> · done</span>}
    </div>
  );
}
