// @vitest-environment jsdom
// The compare page's x toggle: by wall time it reads each run's step_finished events and
// plots the metrics against seconds on the run clock.
import { cleanup, fireEvent, render, screen, waitFor } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { ComparePage } from "../pages/ComparePage";

const roles = (run: number) => ({
  run, t0: 0, t1: 10, horizon: 10, units: [], intervals: [], truncated: false,
  gpu_seconds: { rollout: 0, train: 0, switching: 0, idle: 0 },
  shares: { rollout: 0, train: 0, switching: 0, idle: 0 },
}); // prettier-ignore

const metrics = {
  bucket: 1,
  series: [3, 4].map((run) => ({
    run,
    name: "loss",
    points: [0, 1, 2].map((step) => ({ step, last_step: step, min: step, max: step, last: step })),
  })),
};

function serve(): string[] {
  const seen: string[] = [];
  vi.stubGlobal("fetch", async (url: string) => {
    seen.push(url);
    const run = Number(url.match(/\/api\/runs\/(\d+)\//)?.[1]);
    let body: unknown = { detail: "not found" };
    if (url.startsWith("/api/runs/metrics/")) body = metrics;
    else if (url.includes("/roles/")) body = roles(run);
    else if (url.includes("/events/")) {
      const finished = run === 3 ? [0, 1, 2] : [0]; // run 4 has finished step 0 only
      const after = Number(new URL(url, "http://x").searchParams.get("after"));
      const events = finished
        .map((step) => ({ seq: step + 1, kind: "step_finished", t: 100 * (step + 1), wall: "", data: { step } }))
        .filter((e) => e.seq > after);
      body = { run, events };
    } else if (/\/api\/runs\/\d+\/$/.test(url)) body = { id: run, status: "succeeded" };
    return { ok: body !== null, status: 200, text: async () => JSON.stringify(body) };
  });
  return seen;
}

// jsdom draws nothing: a 2D context and paths whose every call is a no-op are enough for
// uPlot. Installed for this file (Vitest isolates files) and never removed, since uPlot may
// still draw in a microtask after a test has ended.
const noop = () =>
  new Proxy({} as Record<string | symbol, unknown>, {
    get: (target, prop) => (prop in target ? target[prop] : prop === "measureText" ? () => ({ width: 0 }) : () => undefined),
    set: (target, prop, value) => ((target[prop] = value), true),
  });
const context2d = noop();
HTMLCanvasElement.prototype.getContext = (() => context2d) as never;
Object.assign(globalThis, {
  Path2D: function Path2D() {
    return noop();
  },
  ResizeObserver: class {
    observe(): void {}
    disconnect(): void {}
  },
});

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe("ComparePage x axis", () => {
  it("switches from steps to wall time, reading step_finished times per run", async () => {
    const seen = serve();
    render(
      <MemoryRouter initialEntries={["/compare?runs=3,4"]}>
        <ComparePage />
      </MemoryRouter>,
    );
    await screen.findByTestId("chart-loss");
    expect(screen.getByText("Metrics by step")).toBeTruthy();
    const xLabel = () => screen.getByTestId("chart-loss").querySelector(".u-legend .u-series th")?.textContent ?? "";
    // the container renders before uPlot builds its legend in an effect: wait for the legend
    await waitFor(() => expect(xLabel()).toContain("step"));
    expect(seen.some((u) => u.includes("/events/"))).toBe(false); // by step: no events read
    fireEvent.click(screen.getByLabelText("wall time"));
    await screen.findByText("Metrics by wall time");
    await waitFor(() => expect(xLabel()).toContain("wall time (s)"));
    for (const run of [3, 4]) expect(seen).toContain(`/api/runs/${run}/events/?kind=step_finished&after=0&limit=10000`);
  });
});
