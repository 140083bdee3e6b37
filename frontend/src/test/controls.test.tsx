// @vitest-environment jsdom
// Write controls show only to a caller who may use them: `can_edit` on a run (RunView),
// a writer's role in some team (RunsPage: bulk cancel and launch).
import { cleanup, render, screen } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { Run, Team } from "../lib/types";
import { RunView } from "../pages/RunView";
import { RunsPage } from "../pages/RunsPage";

class SilentSocket {
  readyState = 0;
  onopen = null;
  onclose = null;
  onmessage = null;
  send(): void {}
  close(): void {}
}

function run(canEdit: boolean): Run {
  return {
    id: 7, experiment: 1, name: "r", policy: "elastic", backend: "sim", seed: 0, steps: 4,
    status: "running", step: 1, error: "", parent: null, created_at: "2026-01-01T00:00:00Z",
    started_at: null, finished_at: null, can_edit: canEdit,
  }; // prettier-ignore
}

/** Answer the dashboard's GETs from a table of path prefixes (longest first). */
function serve(routes: Record<string, unknown>): string[] {
  const seen: string[] = [];
  const prefixes = Object.keys(routes).sort((a, b) => b.length - a.length);
  vi.stubGlobal("fetch", async (url: string) => {
    seen.push(url);
    const hit = prefixes.find((p) => url.startsWith(p));
    const body = hit === undefined ? { detail: "not found" } : routes[hit];
    return { ok: hit !== undefined, status: hit === undefined ? 404 : 200, text: async () => JSON.stringify(body) };
  });
  return seen;
}

beforeEach(() => vi.stubGlobal("WebSocket", SilentSocket));
afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

const renderRun = (readOnly = false) =>
  render(
    <MemoryRouter>
      <RunView runId={7} readOnly={readOnly} />
    </MemoryRouter>,
  );

describe("RunView controls", () => {
  it("a viewer (can_edit false) sees the run but no cancel, pause, resume, fork or share", async () => {
    serve({ "/api/runs/7/metrics/": { bucket: 1, series: [] }, "/api/trees/": [], "/api/runs/7/checkpoints/": [], "/api/runs/7/": run(false) });
    renderRun();
    await screen.findByText("Run #7 r");
    for (const name of ["cancel", "pause run", "resume", "fork", "share"])
      expect(screen.queryByRole("button", { name }), name).toBeNull();
    expect(screen.getByTestId("pause")).toBeTruthy(); // pausing the live view is not a write
  });

  it("a writer (can_edit true) gets the controls", async () => {
    serve({ "/api/runs/7/metrics/": { bucket: 1, series: [] }, "/api/trees/": [], "/api/runs/7/checkpoints/": [], "/api/runs/7/": run(true) });
    renderRun();
    await screen.findByText("Run #7 r");
    for (const name of ["cancel", "pause run", "resume", "fork", "share"])
      expect(screen.queryByRole("button", { name }), name).not.toBeNull();
  });

  it("a share link's view (readOnly) hides them even if the run said otherwise", async () => {
    serve({ "/api/runs/7/metrics/": { bucket: 1, series: [] }, "/api/trees/": [], "/api/runs/7/checkpoints/": [], "/api/runs/7/": run(true) });
    renderRun(true);
    await screen.findByText("Run #7 r");
    expect(screen.queryByRole("button", { name: "cancel" })).toBeNull();
  });
});

describe("RunsPage controls", () => {
  const page = (role: string, canEdit: boolean) => {
    const teams: Team[] = [{ id: 1, name: "lab", slug: "lab", role }];
    serve({ "/api/teams/": teams, "/api/experiments/": [], "/api/runs/": { next: null, previous: null, results: [run(canEdit)] } });
    render(
      <MemoryRouter>
        <RunsPage />
      </MemoryRouter>,
    );
  };

  it("a viewer gets neither bulk cancel nor launch, but may still compare", async () => {
    page("viewer", false);
    await screen.findByLabelText("select run 7");
    await screen.findByRole("option", { name: "lab" }); // the teams (and roles) have loaded
    expect(screen.queryByRole("button", { name: /cancel selected/ })).toBeNull();
    expect(screen.queryByRole("link", { name: "launch…" })).toBeNull();
    expect(screen.getByRole("button", { name: "compare selected" })).toBeTruthy();
  });

  it("a member gets both", async () => {
    page("member", true);
    await screen.findByLabelText("select run 7");
    await screen.findByRole("button", { name: /cancel selected/ });
    expect(screen.getByRole("link", { name: "launch…" })).toBeTruthy();
  });
});
