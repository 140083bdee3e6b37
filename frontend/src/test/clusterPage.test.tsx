// @vitest-environment jsdom
// The Cluster page marks the GPUs of a node Ray no longer reports (`node_alive` false),
// and follows the cluster stream: it reloads on events and lists the latest ones.
import { act, cleanup, render, screen } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ClusterPage } from "../pages/ClusterPage";
import { FakeSocket } from "./fakeSocket";

const deliver = (ws: FakeSocket, msg: unknown) => act(() => ws.message(msg));

const gpu = (id: number, node: string, alive: boolean, run: number | null = null) => ({
  id, node: id, node_name: node, node_alive: alive, node_last_seen_at: null, index: id % 2,
  model: "gpu_unit", memory_mb: 0, run,
}); // prettier-ignore

beforeEach(() => {
  FakeSocket.all = [];
  vi.stubGlobal("WebSocket", FakeSocket); // no server: the tests drive the socket
});

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe("ClusterPage", () => {
  it("shows a node gone on its GPUs' rows and in the totals", async () => {
    const body = [gpu(0, "head", true, 3), gpu(1, "head", true), gpu(2, "w/1a2b", false), gpu(3, "w/1a2b", false)];
    vi.stubGlobal("fetch", async () => ({ ok: true, status: 200, text: async () => JSON.stringify(body) }));
    render(
      <MemoryRouter>
        <ClusterPage />
      </MemoryRouter>,
    );
    expect(await screen.findByText(/4 GPUs · 1 allocated · 3 free/)).toBeTruthy();
    expect(screen.getByText("2 on nodes gone")).toBeTruthy();
    expect(screen.getAllByText("node gone")).toHaveLength(2);
    const rows = screen.getByTestId("gpus").querySelectorAll("tbody tr");
    expect([...rows].map((r) => r.getAttribute("data-node-gone"))).toEqual([null, null, "true", "true"]);
  });
});

const cev = (seq: number, kind: string, data: Record<string, unknown>) => ({ seq, kind, wall: "2026-01-01T00:00:00Z", data });

describe("ClusterPage's cluster stream", () => {
  it("subscribes, reloads the GPUs when events arrive and lists the latest events", async () => {
    let body = [gpu(0, "head", true), gpu(1, "w", true)];
    let fetches = 0;
    vi.stubGlobal("fetch", async () => {
      fetches += 1;
      return { ok: true, status: 200, text: async () => JSON.stringify(body) };
    });
    render(
      <MemoryRouter>
        <ClusterPage />
      </MemoryRouter>,
    );
    expect(await screen.findByText(/2 GPUs · 0 allocated · 2 free/)).toBeTruthy();
    const ws = FakeSocket.all[0];
    act(() => ws.open());
    expect(ws.sent).toEqual([{ type: "subscribe", stream: "cluster", after: 0 }]);
    expect(screen.getByText("no cluster events yet")).toBeTruthy();

    body = [gpu(0, "head", true, 7), gpu(1, "w", false)];
    const before = fetches;
    deliver(ws, { type: "events", run: 3, events: [cev(1, "run_status", {})] }); // a run's: ignored
    deliver(ws, {
      type: "events",
      stream: "cluster",
      events: [cev(1, "gpu_lease", { run: 7, unit: 0, gpus: [0], held: true }), cev(2, "node_status", { node: "w", node_id: "x", alive: false, gpus: 1 })],
    });
    expect(await screen.findByText(/2 GPUs · 1 allocated · 1 free/)).toBeTruthy();
    expect(fetches).toBeGreaterThan(before);
    const items = [...screen.getByTestId("cluster-events").querySelectorAll("li")].map((li) => li.textContent ?? "");
    expect(items).toHaveLength(2);
    expect(items[0]).toContain("node w gone (1 GPU)"); // newest first
    expect(items[1]).toContain("run 7 unit 0 leased head:0");

    deliver(ws, { type: "events", stream: "cluster", events: [cev(4, "gpu_lease", { run: 7, unit: 0, gpus: [0], held: false })] });
    expect(ws.sent.at(-1)).toEqual({ type: "subscribe", stream: "cluster", after: 2 }); // a gap: ask again
    expect(screen.getByTestId("cluster-events").querySelectorAll("li")).toHaveLength(2);
  });
});
