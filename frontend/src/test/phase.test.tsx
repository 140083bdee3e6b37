// @vitest-environment jsdom
import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { PhaseBar } from "../components/PhaseBar";
import { latestPhase } from "../lib/phase";
import { ev } from "./events";

afterEach(cleanup);

describe("PhaseBar", () => {
  it("shows nothing before a phase, then the latest phase with its progress", () => {
    const events = [ev("run_status", 0, { status: "running", step: 0 })];
    const { rerender } = render(<PhaseBar events={events} version={0} />);
    expect(screen.queryByTestId("phase")).toBeNull();
    events.push(ev("phase_progress", 1, { phase: "model build", done: 1, total: 1, message: "" }));
    events.push(ev("phase_progress", 9, { phase: "warm start", done: 250, total: 1000, message: "loss 0.412 (target 0.12)" }));
    events.push(ev("rollout_started", 9.5, { rollout_id: "a", task_id: "x", group_id: "g", step: 0 }));
    rerender(<PhaseBar events={events} version={1} />);
    expect(screen.getByTestId("phase-text").textContent).toBe("warm start 250/1000, loss 0.412 (target 0.12)");
    expect((screen.getByTestId("phase-bar") as HTMLProgressElement).value).toBe(0.25);
    expect(screen.queryByText(/done/)).toBeNull();
    events.push(ev("phase_progress", 20, { phase: "benchmark", done: 8, total: 8, message: "version 0, greedy" }));
    rerender(<PhaseBar events={events} version={2} />);
    expect(screen.getByTestId("phase-text").textContent).toBe("benchmark 8/8, version 0, greedy");
    expect(screen.getByText(/done/)).toBeTruthy();
  });

  it("reads the latest phase_progress event, whatever follows it", () => {
    expect(latestPhase([])).toBeNull();
    const p = latestPhase([
      ev("phase_progress", 1, { phase: "engine start", done: 1, total: 2 }),
      ev("step_finished", 2, { step: 1, version: 1, metrics: {} }),
    ]);
    expect(p).toEqual({ phase: "engine start", done: 1, total: 2, message: "", t: 1 });
  });
});
