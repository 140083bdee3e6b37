// GPU inventory and which run holds each GPU now. The cluster stream (/ws/, "stream":
// "cluster") says when a node goes or comes back and when GPUs are leased or released:
// the list reloads then, and the last few of those events show below it. A slow poll
// stays as a fallback while the stream is down.

import { useEffect, useRef, useState } from "react";
import { Link } from "react-router-dom";
import { listAll } from "../lib/api";
import { type ClusterEvent, describeClusterEvent } from "../lib/cluster";
import { EventStream, type StreamState } from "../lib/eventStream";

interface Gpu {
  id: number;
  node_name: string;
  node_alive: boolean; // false: Ray no longer reports the node (it keeps its rows)
  index: number;
  model: string;
  memory_mb: number;
  run: number | null;
}

const RECENT = 8; // cluster events listed
const POLL_MS = 5000; // reload the list this often while the stream is not live

export function ClusterPage() {
  const [gpus, setGpus] = useState<Gpu[] | null>(null);
  const [error, setError] = useState("");
  const [recent, setRecent] = useState<ClusterEvent[]>([]);
  const [live, setLive] = useState<StreamState>("connecting");
  const liveRef = useRef<StreamState>("connecting");
  useEffect(() => {
    let loading = false;
    let again = false;
    const load = async () => {
      if (loading) {
        again = true; // events arrived during a load: load once more after it
        return;
      }
      loading = true;
      try {
        setGpus(await listAll<Gpu>("/api/gpus/?page_size=500"));
      } catch (e) {
        setError(String(e));
      } finally {
        loading = false;
        if (again) {
          again = false;
          void load();
        }
      }
    };
    void load();
    const stream = new EventStream<ClusterEvent>({ stream: "cluster" }, {
      onEvents: (events) => {
        setRecent((r) => [...events.slice(-RECENT).reverse(), ...r].slice(0, RECENT));
        void load();
      },
      onState: (state) => {
        liveRef.current = state;
        setLive(state);
      },
    });
    stream.start();
    const t = setInterval(() => liveRef.current !== "live" && void load(), POLL_MS);
    return () => {
      clearInterval(t);
      stream.stop();
    };
  }, []);
  const held = gpus?.filter((g) => g.run !== null).length ?? 0;
  const gone = gpus?.filter((g) => !g.node_alive).length ?? 0;
  const byId = new Map(gpus?.map((g) => [g.id, `${g.node_name}:${g.index}`]));
  const gpuName = (id: number) => byId.get(id) ?? `gpu ${id}`;
  return (
    <div>
      <h2>Cluster</h2>
      {error && <p className="error">{error}</p>}
      {gpus && (
        <p>
          {gpus.length} GPUs · {held} allocated · {gpus.length - held} free
          {gone > 0 && <> · <span className="error">{gone} on nodes gone</span></>}
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
            <tr key={g.id} className={g.node_alive ? undefined : "muted"} data-node-gone={!g.node_alive || undefined}>
              <td>
                {g.node_name}
                {!g.node_alive && <span className="badge status-failed">node gone</span>}
              </td>
              <td>{g.index}</td>
              <td>{g.model}</td>
              <td>{(g.memory_mb / 1024).toFixed(0)} GiB</td>
              <td>{g.run ? <Link to={`/runs/${g.run}`}>run {g.run}</Link> : <span className="muted">free</span>}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h3>
        Recent cluster events <span className="muted">({live === "live" ? "live" : `${live}, polling`})</span>
      </h3>
      {recent.length === 0 && <p className="muted">no cluster events yet</p>}
      <ul data-testid="cluster-events">
        {recent.map((ev) => (
          <li key={ev.seq} className={ev.kind === "node_status" && !ev.data.alive ? "error" : undefined}>
            <span className="muted">{new Date(ev.wall).toLocaleTimeString()}</span> {describeClusterEvent(ev, gpuName)}
          </li>
        ))}
      </ul>
    </div>
  );
}
