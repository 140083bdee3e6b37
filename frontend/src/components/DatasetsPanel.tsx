// A team's datasets: task and trajectory files uploaded once and named in run configs as
// "dataset:<id>" (rollout.tasks, warm_start.data, train.offpolicy_data).

import { useCallback, useEffect, useState } from "react";
import { api, listAll } from "../lib/api";
import { compact } from "../lib/format";

interface Dataset {
  id: number;
  team: number;
  name: string;
  kind: string;
  format: string;
  size: number;
  sha256: string;
  rows: number;
  created_by: string | null;
  created_at: string;
}

/** A refusal's message: the fields the API named (`{"file": ["line 3: ..."]}`). */
function refusal(e: unknown): string {
  const body = (e as { body?: unknown }).body;
  if (body && typeof body === "object") {
    return Object.entries(body)
      .map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join("; ") : String(v)}`)
      .join(" · ");
  }
  return String(e);
}

export function DatasetsPanel({ teamId, canWrite }: { teamId: number; canWrite: boolean }) {
  const [rows, setRows] = useState<Dataset[]>([]);
  const [file, setFile] = useState<File | null>(null);
  const [name, setName] = useState("");
  const [kind, setKind] = useState("tasks");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);

  const load = useCallback(async () => {
    setRows(await listAll<Dataset>(`/api/datasets/?team=${teamId}`));
  }, [teamId]);

  useEffect(() => {
    load().catch((e) => setError(refusal(e)));
  }, [load]);

  const upload = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!file) return;
    const body = new FormData();
    body.append("file", file);
    body.append("name", name || file.name);
    body.append("kind", kind);
    body.append("team", String(teamId));
    setBusy(true);
    setError("");
    try {
      await api("/api/datasets/", { method: "POST", body });
      setName("");
      await load();
    } catch (err) {
      setError(refusal(err));
    } finally {
      setBusy(false);
    }
  };
  const remove = async (id: number) => {
    try {
      await api(`/api/datasets/${id}/`, { method: "DELETE" });
      await load();
    } catch (err) {
      setError(refusal(err));
    }
  };

  return (
    <>
      <h3>Datasets</h3>
      <p className="muted">
        task files (JSONL or Parquet) and trajectory files (gyre.trajectory/v1 or a message log), named in a run
        config as <code>dataset:ID</code>
      </p>
      {error && <p className="error" data-testid="dataset-error">{error}</p>}
      <table data-testid="datasets">
        <tbody>
          {rows.map((d) => (
            <tr key={d.id}>
              <td>
                <code>dataset:{d.id}</code>
              </td>
              <td>{d.name}</td>
              <td>
                {d.kind} ({d.format}, {d.rows} rows, {compact(d.size)}B)
              </td>
              <td title={d.sha256}>
                {d.created_by ?? "?"}, {new Date(d.created_at).toLocaleString()}
              </td>
              <td>{canWrite && <button onClick={() => void remove(d.id)}>delete</button>}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {canWrite && (
        <form onSubmit={upload}>
          <input type="file" aria-label="dataset file" onChange={(e) => setFile(e.target.files?.[0] ?? null)} />
          <input placeholder="name" value={name} onChange={(e) => setName(e.target.value)} />
          <select value={kind} onChange={(e) => setKind(e.target.value)} aria-label="dataset kind">
            <option value="tasks">tasks</option>
            <option value="trajectories">trajectories</option>
          </select>
          <button disabled={!file || busy}>{busy ? "uploading…" : "upload dataset"}</button>
        </form>
      )}
    </>
  );
}
