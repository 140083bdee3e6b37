// The websocket resume cursor: events are accepted once, in seq order; a reconnect
// subscribes `after` the last seq seen, so nothing is lost or repeated.

import { getShareKey } from "./api";
import type { RunEvent } from "./types";

export class SeqCursor {
  last: number;
  constructor(after = 0) {
    this.last = after;
  }

  /**
   * The events not seen yet, in order. `gap` is true when the batch skips seqs (the
   * caller should resubscribe from `last`); events past a gap are not accepted.
   */
  accept(events: RunEvent[]): { fresh: RunEvent[]; gap: boolean } {
    const fresh: RunEvent[] = [];
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

interface WsLike {
  readyState: number;
  send(data: string): void;
  close(): void;
  onopen: ((ev: Event) => void) | null;
  onclose: ((ev: CloseEvent) => void) | null;
  onmessage: ((ev: MessageEvent) => void) | null;
}

export interface StreamOptions {
  url?: string;
  after?: number;
  onEvents: (events: RunEvent[]) => void;
  onState?: (state: StreamState, detail?: string) => void;
  makeSocket?: (url: string) => WsLike;
  retryMs?: number;
}

export function wsUrl(): string {
  const proto = window.location.protocol === "https:" ? "wss" : "ws";
  const share = getShareKey();
  return `${proto}://${window.location.host}/ws/${share ? `?share=${encodeURIComponent(share)}` : ""}`;
}

/** One run's live events over `/ws/`, with reconnect-and-resume and a pause toggle. */
export class RunStream {
  readonly cursor: SeqCursor;
  private ws: WsLike | null = null;
  private held: RunEvent[] = [];
  private stopped = false;
  private paused = false;
  private retry: ReturnType<typeof setTimeout> | null = null;
  private readonly opts: Required<Omit<StreamOptions, "after" | "onState">> & StreamOptions;

  constructor(
    readonly run: number,
    opts: StreamOptions,
  ) {
    this.cursor = new SeqCursor(opts.after ?? 0);
    this.opts = {
      url: opts.url ?? wsUrl(),
      makeSocket: opts.makeSocket ?? ((u) => new WebSocket(u)),
      retryMs: opts.retryMs ?? 1000,
      ...opts,
    } as Required<Omit<StreamOptions, "after" | "onState">> & StreamOptions;
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

  private open(): void {
    this.opts.onState?.("connecting");
    const ws = this.opts.makeSocket(this.opts.url);
    this.ws = ws;
    ws.onopen = () => {
      ws.send(JSON.stringify({ type: "subscribe", run: this.run, after: this.cursor.last }));
      this.opts.onState?.(this.paused ? "paused" : "live");
    };
    ws.onmessage = (msg) => this.handle(ws, JSON.parse(String(msg.data)));
    ws.onclose = () => {
      if (this.ws !== ws || this.stopped) return;
      this.ws = null;
      this.opts.onState?.("connecting", "reconnecting");
      this.retry = setTimeout(() => this.open(), this.opts.retryMs);
    };
  }

  /** Exposed for tests: one server message. */
  handle(ws: WsLike, msg: { type?: string; run?: number; events?: RunEvent[]; error?: string }): void {
    if (msg.type === "error") {
      this.opts.onState?.("closed", msg.error);
      return;
    }
    if (msg.type !== "events" || msg.run !== this.run || !msg.events) return;
    const { fresh, gap } = this.cursor.accept(msg.events);
    if (fresh.length) {
      if (this.paused) this.held.push(...fresh);
      else this.opts.onEvents(fresh);
    }
    if (gap) ws.send(JSON.stringify({ type: "subscribe", run: this.run, after: this.cursor.last }));
  }
}
