// One run's live view state: the event stream folded into the role timeline, rollout
// tracker, metric store, system metrics and event log. Re-renders are batched to one per
// frame, and the stores are mutated in place so zoom and selection in the views survive
// updates.

import { useEffect, useRef, useState } from "react";
import { api } from "./api";
import { EventStream, type StreamState } from "./eventStream";
import { MetricStore } from "./metrics";
import { RoleTimeline } from "./roles";
import { RolloutTracker } from "./rollouts";
import { SysMetricsStore } from "./sysmetrics";
import type { MetricsResponse, RunEvent } from "./types";

const KEEP_EVENTS = 20000;

export interface LiveRun {
  timeline: RoleTimeline;
  rollouts: RolloutTracker;
  metrics: MetricStore;
  sys: SysMetricsStore;
  events: RunEvent[];
  lastStatus: string | null;
}

export function useRunLive(runId: number) {
  const live = useRef<LiveRun | null>(null);
  const [version, setVersion] = useState(0);
  const [state, setState] = useState<StreamState>("connecting");
  const [paused, setPaused] = useState(false);
  const stream = useRef<EventStream<RunEvent> | null>(null);

  if (!live.current) live.current = fresh();

  useEffect(() => {
    const l = fresh();
    live.current = l;
    let frame = 0;
    const schedule = () => {
      if (!frame) frame = requestAnimationFrame(() => ((frame = 0), setVersion((v) => v + 1)));
    };
    void api<MetricsResponse>(`/api/runs/${runId}/metrics/?points=1000`)
      .then((resp) => {
        l.metrics.loadServer(resp, runId);
        schedule();
      })
      .catch(() => undefined); // live points still arrive
    const s = new EventStream<RunEvent>({ run: runId }, {
      onEvents: (events) => {
        for (const ev of events) {
          l.timeline.apply(ev);
          l.rollouts.apply(ev);
          l.metrics.apply(ev);
          l.sys.apply(ev);
          if (ev.kind === "run_status") l.lastStatus = String(ev.data.status);
        }
        l.events.push(...events);
        if (l.events.length > KEEP_EVENTS) l.events.splice(0, l.events.length - KEEP_EVENTS);
        schedule();
      },
      onState: (st) => setState(st),
    });
    stream.current = s;
    s.start();
    return () => {
      s.stop();
      cancelAnimationFrame(frame);
    };
  }, [runId]);

  const togglePause = () => {
    const next = !paused;
    setPaused(next);
    stream.current?.setPaused(next);
  };

  return { live: live.current, version, state, paused, togglePause, cursor: () => stream.current?.cursor.last ?? 0 };
}

function fresh(): LiveRun {
  return {
    timeline: new RoleTimeline(),
    rollouts: new RolloutTracker(),
    metrics: new MetricStore(),
    sys: new SysMetricsStore(),
    events: [],
    lastStatus: null,
  };
}
