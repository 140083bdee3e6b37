// The websocket's event streams, with reconnect-and-resume: one run's events
// (`{run: ID}`, numbered by the run's seq) or the cluster's (`{stream: "cluster"}`, nodes
// gone and back, GPUs leased and released, numbered from 1 on their own). Events are
// accepted once, in seq order; a reconnect subscribes `after` the last seq seen and a gap
// asks again from there, so nothing is lost or repeated.

import { getShareKey } from "./api";

interface Numbered {
  seq: number;
}

export class SeqCursor<E extends Numbered = Numbered> {
  last: number;
  constructor(after = 0) {
    this.last = after;
  }

  /**
   * The events not seen yet, in order. `gap` is true when the batch skips seqs (the
   * caller should resubscribe from `last`); events past a gap are not accepted.
   */
  accept(events: E[]): { fresh: E[]; gap: boolean } {
    const fresh: E[] = [];
    const sorted = [...events].sort((a, b) => a.seq - b.seq);
    for (const ev of sorted) {
      if (ev.seq <= this.last) continue; // a duplicate after a resubscribe
      if (ev.seq !== this.last + 1) return { fresh, gap: true };
      fresh.push(ev);
      this.last = ev.seq;
    }
    return { fresh, gap: false };
  }
}

export type StreamState = "connecting" | "live" | "paused" | "closed";

/** What a stream subscribes to: one run, or a named stream such as "cluster". */
export type Topic = { run: number } | { stream: string };

interface WsLike {
  send(data: string): void;
  close(): void;
  onopen: ((ev: Event) => void) | null;
  onclose: ((ev: CloseEvent) => void) | null;
  onmessage: ((ev: MessageEvent) => void) | null;
}

export interface StreamOptions<E> {
  url?: string;
  after?: number;
  onEvents: (events: E[]) => void;
  onState?: (state: StreamState, detail?: string) => void;
  makeSocket?: (url: string) => WsLike;
  retryMs?: number;
}

interface ServerMessage<E> {
  type?: string;
  run?: number;
  stream?: string;
  events?: E[];
  error?: string;
}

export function wsUrl(): string {
  const proto = window.location.protocol === "https:" ? "wss" : "ws";
  const share = getShareKey();
  return `${proto}://${window.location.host}/ws/${share ? `?share=${encodeURIComponent(share)}` : ""}`;
}

/** One topic's live events over `/ws/`, with reconnect-and-resume and a pause toggle. */
export class EventStream<E extends Numbered> {
  readonly cursor: SeqCursor<E>;
  private ws: WsLike | null = null;
  private held: E[] = [];
  private stopped = false;
  private paused = false;
  private retry: ReturnType<typeof setTimeout> | null = null;

  constructor(
    readonly topic: Topic,
    private readonly opts: StreamOptions<E>,
  ) {
    this.cursor = new SeqCursor<E>(opts.after ?? 0);
  }

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

  /** While paused, events are still received (the cursor advances) but held back. */
  setPaused(paused: boolean): void {
    this.paused = paused;
    this.opts.onState?.(paused ? "paused" : "live");
    if (!paused && this.held.length) {
      const out = this.held;
      this.held = [];
      this.opts.onEvents(out);
    }
  }

  private subscribe(ws: WsLike): void {
    ws.send(JSON.stringify({ type: "subscribe", ...this.topic, after: this.cursor.last }));
  }

  /** True when a message names this stream's topic (`named`: it names some topic). */
  private ours(msg: ServerMessage<E>): { ours: boolean; named: boolean } {
    const named = msg.run !== undefined || msg.stream !== undefined;
    const t = this.topic;
    const ours = "run" in t ? msg.run === t.run : msg.stream === t.stream;
    return { ours, named };
  }

  private open(): void {
    this.opts.onState?.("connecting");
    const ws = (this.opts.makeSocket ?? ((u) => new WebSocket(u)))(this.opts.url ?? wsUrl());
    this.ws = ws;
    ws.onopen = () => {
      this.subscribe(ws);
      this.opts.onState?.(this.paused ? "paused" : "live");
    };
    ws.onmessage = (msg) => this.handle(ws, JSON.parse(String(msg.data)) as ServerMessage<E>);
    ws.onclose = () => {
      if (this.ws !== ws || this.stopped) return;
      this.ws = null;
      this.opts.onState?.("connecting", "reconnecting");
      this.retry = setTimeout(() => this.open(), this.opts.retryMs ?? 1000);
    };
  }

  /** Exposed for tests: one server message. An error naming no topic is the socket's. */
  handle(ws: WsLike, msg: ServerMessage<E>): void {
    const { ours, named } = this.ours(msg);
    if (msg.type === "error") {
      if (ours || !named) this.opts.onState?.("closed", msg.error);
      return;
    }
    if (msg.type !== "events" || !ours || !msg.events) return;
    const { fresh, gap } = this.cursor.accept(msg.events);
    if (fresh.length) {
      if (this.paused) this.held.push(...fresh);
      else this.opts.onEvents(fresh);
    }
    if (gap) this.subscribe(ws);
  }
}
