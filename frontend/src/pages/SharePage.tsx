// A share link's read-only view: no account; every request carries the link's key.

import { useEffect, useState } from "react";
import { useParams } from "react-router-dom";
import { listAll, setShareKey } from "../lib/api";
import type { Run } from "../lib/types";
import { RunView } from "./RunView";

export function SharePage() {
  const { key = "" } = useParams();
  setShareKey(key); // before any child fetches
  const [runs, setRuns] = useState<Run[] | null>(null);
  const [chosen, setChosen] = useState<number | null>(null);
  const [error, setError] = useState("");
  useEffect(() => {
    listAll<Run>("/api/runs/")
      .then((rs) => {
        setRuns(rs);
        setChosen(rs[0]?.id ?? null);
      })
      .catch((e) => setError(`this link is not valid (revoked or mistyped): ${String(e)}`));
  }, [key]);
  if (error) return <p className="error">{error}</p>;
  if (!runs) return <p>loading…</p>;
  return (
    <div data-testid="shared-view">
      <p className="note">read-only shared view</p>
      {runs.length > 1 && (
        <div className="filters">
          {runs.map((r) => (
            <button key={r.id} className={r.id === chosen ? "active" : ""} onClick={() => setChosen(r.id)}>
              {r.name || `run ${r.id}`}
            </button>
          ))}
        </div>
      )}
      {chosen !== null ? <RunView runId={chosen} readOnly /> : <p className="muted">nothing shared here yet</p>}
    </div>
  );
}
