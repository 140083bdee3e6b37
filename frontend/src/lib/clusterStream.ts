// The websocket's `cluster` stream: nodes gone and back, GPUs leased and released. Events
// are numbered from 1 on their own (not a run's seq); a reconnect resumes after the last
// one seen, and a gap asks again from there, as RunStream does for a run.

import { type StreamState, wsUrl } from "./cursor";

export interface ClusterEvent {
  seq: number;
  kind: string; // node_status | gpu_lease
  wall: string;
  data: Record<string, unknown>;
}

interface WsLike {
  send(data: string): void;
  close(): void;
  onopen: ((ev: Event) => void) | null;
  onclose: ((ev: CloseEvent) => void) | null;
  onmessage: ((ev: MessageEvent) => void) | null;
}

export interface ClusterStreamOptions {
  url?: string;
  onEvents: (events: ClusterEvent[]) => void;
  onState?: (state: StreamState, detail?: string) => void;
  makeSocket?: (url: string) => WsLike;
  retryMs?: number;
}

interface ServerMessage {
  type?: string;
  stream?: string;
  events?: ClusterEvent[];
  error?: string;
}

export class ClusterStream {
  last = 0; // the last seq accepted
  private ws: WsLike | null = null;
  private stopped = false;
  private retry: ReturnType<typeof setTimeout> | null = null;

  constructor(private readonly opts: ClusterStreamOptions) {}

  start(): void {
    this.stopped = false;
    this.open();
  }

  stop(): void {
    this.stopped = true;
    if (this.retry) clearTimeout(this.retry);
    this.ws?.close();
    this.ws = null;
    this.opts.onState?.("closed");
  }

  private subscribe(ws: WsLike): void {
    ws.send(JSON.stringify({ type: "subscribe", stream: "cluster", after: this.last }));
  }

  private open(): void {
    this.opts.onState?.("connecting");
    const ws = (this.opts.makeSocket ?? ((u) => new WebSocket(u)))(this.opts.url ?? wsUrl());
    this.ws = ws;
    ws.onopen = () => {
      this.subscribe(ws);
      this.opts.onState?.("live");
    };
    ws.onmessage = (msg) => this.handle(ws, JSON.parse(String(msg.data)) as ServerMessage);
    ws.onclose = () => {
      if (this.ws !== ws || this.stopped) return;
      this.ws = null;
      this.opts.onState?.("connecting", "reconnecting");
      this.retry = setTimeout(() => this.open(), this.opts.retryMs ?? 1000);
    };
  }

  /** Exposed for tests: one server message. */
  handle(ws: WsLike, msg: ServerMessage): void {
    if (msg.stream !== "cluster") return; // a run subscription's, on a shared socket
    if (msg.type === "error") {
      this.opts.onState?.("closed", msg.error);
      return;
    }
    if (msg.type !== "events" || !msg.events) return;
    const fresh: ClusterEvent[] = [];
    let gap = false;
    for (const ev of [...msg.events].sort((a, b) => a.seq - b.seq)) {
      if (ev.seq <= this.last) continue; // a duplicate after a resubscribe
      if (ev.seq !== this.last + 1) {
        gap = true;
        break;
      }
      fresh.push(ev);
      this.last = ev.seq;
    }
    if (fresh.length) this.opts.onEvents(fresh);
    if (gap) this.subscribe(ws);
  }
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
