// GPU inventory and which run holds each GPU now.

import { useEffect, useState } from "react";
import { Link } from "react-router-dom";
import { listAll } from "../lib/api";

interface Gpu {
  id: number;
  node_name: string;
  index: number;
  model: string;
  memory_mb: number;
  run: number | null;
}

export function ClusterPage() {
  const [gpus, setGpus] = useState<Gpu[] | null>(null);
  const [error, setError] = useState("");
  useEffect(() => {
    const load = () => listAll<Gpu>("/api/gpus/?page_size=500").then(setGpus).catch((e) => setError(String(e)));
    void load();
    const t = setInterval(load, 5000);
    return () => clearInterval(t);
  }, []);
  const held = gpus?.filter((g) => g.run !== null).length ?? 0;
  return (
    <div>
      <h2>Cluster</h2>
      {error && <p className="error">{error}</p>}
      {gpus && (
        <p>
          {gpus.length} GPUs · {held} allocated · {gpus.length - held} free
        </p>
      )}
      {gpus?.length === 0 && <p className="muted">no GPUs registered (an administrator registers them, or Ray reports them)</p>}
      <table data-testid="gpus">
        <thead>
          <tr>
            <th>node</th>
            <th>gpu</th>
            <th>model</th>
            <th>memory</th>
            <th>held by</th>
          </tr>
        </thead>
        <tbody>
          {gpus?.map((g) => (
            <tr key={g.id}>
              <td>{g.node_name}</td>
              <td>{g.index}</td>
              <td>{g.model}</td>
              <td>{(g.memory_mb / 1024).toFixed(0)} GiB</td>
              <td>{g.run ? <Link to={`/runs/${g.run}`}>run {g.run}</Link> : <span className="muted">free</span>}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
