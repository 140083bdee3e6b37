// The cluster stream's events (nodes gone and back, GPUs leased and released) and how the
// cluster page words them. They arrive over an `EventStream` subscribed to `{stream: "cluster"}`.

export interface ClusterEvent {
  seq: number;
  kind: string; // node_status | gpu_lease
  wall: string;
  data: Record<string, unknown>;
}

/** One line for the cluster page's recent-events list; `gpuName` names a GPU by its id. */
export function describeClusterEvent(ev: ClusterEvent, gpuName: (id: number) => string = String): string {
  const d = ev.data;
  if (ev.kind === "node_status") {
    const gpus = Number(d.gpus ?? 0);
    return `node ${String(d.node)} ${d.alive ? "up" : "gone"} (${gpus} GPU${gpus === 1 ? "" : "s"})`;
  }
  if (ev.kind === "gpu_lease") {
    const ids: unknown[] = Array.isArray(d.gpus) ? d.gpus : [];
    const names = ids.map((id) => gpuName(Number(id))).join(", ");
    return `run ${String(d.run)} unit ${String(d.unit)} ${d.held ? "leased" : "released"} ${names}`;
  }
  return ev.kind;
}
