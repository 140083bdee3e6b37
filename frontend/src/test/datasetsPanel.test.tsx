// @vitest-environment jsdom
// The Team page's datasets: listed as "dataset:ID" for every role; a writer uploads
// (multipart file, name, kind, team) and sees a refusal by field; a viewer gets no form.
import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";
import { DatasetsPanel } from "../components/DatasetsPanel";

const ROW = {
  id: 5, team: 3, name: "arith tasks", kind: "tasks", format: "jsonl", size: 2048,
  sha256: "ab".repeat(32), rows: 12, created_by: "member", created_at: "2026-01-01T00:00:00Z",
}; // prettier-ignore

interface Sent {
  url: string;
  method: string;
  body: unknown;
}

function serve(post: { status: number; body: unknown }): Sent[] {
  const sent: Sent[] = [];
  vi.stubGlobal("fetch", async (url: string, init: RequestInit) => {
    sent.push({ url, method: init.method ?? "GET", body: init.body });
    const answer = init.method === "POST" ? post : { status: 200, body: { next: null, previous: null, results: [ROW] } };
    return { ok: answer.status < 300, status: answer.status, text: async () => JSON.stringify(answer.body) };
  });
  return sent;
}

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe("DatasetsPanel", () => {
  it("lists the team's datasets by id and uploads a file as multipart", async () => {
    const sent = serve({ status: 201, body: ROW });
    render(<DatasetsPanel teamId={3} canWrite={true} />);
    await screen.findByText("dataset:5");
    expect(sent[0].url).toBe("/api/datasets/?team=3");
    const file = new File(['{"id": "t1"}\n'], "tasks.jsonl");
    fireEvent.change(screen.getByLabelText("dataset file"), { target: { files: [file] } });
    fireEvent.change(screen.getByLabelText("dataset kind"), { target: { value: "trajectories" } });
    fireEvent.click(screen.getByRole("button", { name: "upload dataset" }));
    await vi.waitFor(() => expect(sent.some((s) => s.method === "POST")).toBe(true));
    const post = sent.find((s) => s.method === "POST")!;
    expect(post.url).toBe("/api/datasets/");
    const form = post.body as FormData;
    expect([form.get("name"), form.get("kind"), form.get("team")]).toEqual(["tasks.jsonl", "trajectories", "3"]);
    expect((form.get("file") as File).name).toBe("tasks.jsonl");
  });

  it("shows a refusal by field, and a viewer gets no upload form or delete", async () => {
    serve({ status: 400, body: { file: ["line 2: x: expected a finite number"] } });
    const { unmount } = render(<DatasetsPanel teamId={3} canWrite={true} />);
    await screen.findByText("dataset:5");
    fireEvent.change(screen.getByLabelText("dataset file"), { target: { files: [new File(["x"], "bad.jsonl")] } });
    fireEvent.click(screen.getByRole("button", { name: "upload dataset" }));
    expect((await screen.findByTestId("dataset-error")).textContent).toBe("file: line 2: x: expected a finite number");
    unmount();
    render(<DatasetsPanel teamId={3} canWrite={false} />);
    await screen.findByText("dataset:5");
    expect(screen.queryByRole("button", { name: "upload dataset" })).toBeNull();
    expect(screen.queryByRole("button", { name: "delete" })).toBeNull();
  });
});
