import { describe, expect, it } from "vitest";
import { type Checkpoint, type CheckpointExport, exportCell, exportsPending } from "../lib/checkpoints";

const exp = (status: CheckpointExport["status"], extra: Partial<CheckpointExport> = {}): CheckpointExport => ({
  version: 2,
  status,
  error: "",
  size_bytes: 2_500_000,
  created_at: "2026-01-01T00:00:00Z",
  finished_at: null,
  ...extra,
});

describe("exportCell", () => {
  it("offers the export to writers, the download once done, and again after a failure", () => {
    expect(exportCell(null, true, true)).toEqual({ text: "", canAsk: true, canDownload: false });
    expect(exportCell(null, false, true).canAsk).toBe(false);
    expect(exportCell(exp("running"), true, true)).toEqual({ text: "running", canAsk: false, canDownload: false });
    expect(exportCell(exp("done"), true, true)).toEqual({ text: "done, 2.5 MB", canAsk: false, canDownload: true });
    expect(exportCell(exp("done"), false, false).canDownload).toBe(false);
    expect(exportCell(exp("failed", { error: "no model" }), true, true)).toEqual({
      text: "failed: no model",
      canAsk: true,
      canDownload: false,
    });
  });

  it("reads the table again while an export is queued or running", () => {
    const row = (e: CheckpointExport | null): Checkpoint => ({
      step: 2, version: 2, size_bytes: 1, created_at: "", benchmark: {}, export: e,
    });
    expect(exportsPending([row(null), row(exp("done"))])).toBe(false);
    expect(exportsPending([row(exp("queued"))])).toBe(true);
    expect(exportsPending([row(exp("running"))])).toBe(true);
  });
});
