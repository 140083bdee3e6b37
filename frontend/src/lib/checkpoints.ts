// A run checkpoint's Hugging Face export as the run page's table shows it.

export type ExportStatus = "queued" | "running" | "done" | "failed";

export interface CheckpointExport {
  version: number;
  status: ExportStatus;
  error: string;
  size_bytes: number;
  created_at: string;
  finished_at: string | null;
}

export interface Checkpoint {
  step: number;
  version: number;
  size_bytes: number;
  created_at: string;
  benchmark: Record<string, number>;
  export: CheckpointExport | null;
}

export interface ExportCell {
  text: string; // the status shown ("" when never asked for)
  canAsk: boolean; // offer the export button (writers; again after a failure)
  canDownload: boolean; // offer the tar of the exported directory
}

export function exportCell(e: CheckpointExport | null, canExport: boolean, canDownload: boolean): ExportCell {
  if (e === null) return { text: "", canAsk: canExport, canDownload: false };
  if (e.status === "done")
    return { text: `done, ${(e.size_bytes / 1e6).toFixed(1)} MB`, canAsk: false, canDownload };
  if (e.status === "failed") return { text: `failed: ${e.error}`, canAsk: canExport, canDownload: false };
  return { text: e.status, canAsk: false, canDownload: false };
}

// Whether the table should be read again soon: an export is still under way.
export function exportsPending(list: Checkpoint[]): boolean {
  return list.some((c) => c.export !== null && (c.export.status === "queued" || c.export.status === "running"));
}
