// GPU role timeline from `role_change` events: one lane of segments per unit, and the
// share of GPUs in each role over time (a step function sampled at every change).

import { ROLES, type Role, type RunEvent } from "./types";

export interface Segment {
  role: Role;
  start: number;
  end: number | null; // null while the unit still holds the role
}

/** GET /api/runs/{id}/roles/: the stored role intervals (platform cluster selectors). */
export interface RoleIntervals {
  run: number;
  t0: number;
  t1: number;
  horizon: number; // the run's clock now: where open intervals end
  units: { unit: number; gpus: number }[];
  intervals: { unit: number; role: string; start: number; end: number | null }[];
  truncated: boolean; // more intervals exist in the window than were sent
  gpu_seconds: Record<Role, number>; // over the whole window, computed by the server
  shares: Record<Role, number>;
}

export interface Shares {
  t: number[];
  share: Record<Role, number[]>; // fraction of GPUs in [0, 1]
}

function asRole(value: unknown): Role {
  return (ROLES as string[]).includes(String(value)) ? (value as Role) : "idle";
}

export class RoleTimeline {
  readonly lanes = new Map<number, Segment[]>();
  private readonly weight = new Map<number, number>(); // GPUs per unit
  private changes = 0;
  private cached: Shares | null = null;
  private cachedAt = -1;
  tMax = 0;

  /** Apply one event; returns true when it changed the timeline. */
  apply(ev: RunEvent): boolean {
    if (ev.kind !== "role_change") {
      if (ev.t > this.tMax) this.tMax = ev.t;
      return false;
    }
    const unit = Number(ev.data.unit);
    const gpus = Array.isArray(ev.data.gpus) ? ev.data.gpus.length : 1;
    const to = asRole(ev.data.to_role);
    const t = ev.t;
    if (t > this.tMax) this.tMax = t;
    this.weight.set(unit, Math.max(1, gpus));
    let lane = this.lanes.get(unit);
    if (!lane) {
      lane = [];
      this.lanes.set(unit, lane);
      const from = ev.data.from_role;
      if (from && t > 0) lane.push({ role: asRole(from), start: 0, end: t });
    }
    const open = lane[lane.length - 1];
    if (open && open.end === null) {
      open.end = Math.max(open.start, t);
      if (open.end === open.start) lane.pop(); // a zero-length segment carries nothing
    }
    lane.push({ role: to, start: t, end: null });
    this.changes++;
    return true;
  }

  /** A timeline from the stored intervals rather than from events (no event cap). */
  static fromIntervals(resp: RoleIntervals): RoleTimeline {
    const tl = new RoleTimeline();
    for (const u of resp.units) tl.weight.set(u.unit, Math.max(1, u.gpus));
    for (const iv of resp.intervals) {
      if (iv.end !== null && iv.end <= iv.start) continue; // carries nothing
      let lane = tl.lanes.get(iv.unit);
      if (!lane) tl.lanes.set(iv.unit, (lane = []));
      lane.push({ role: asRole(iv.role), start: iv.start, end: iv.end });
      if (!tl.weight.has(iv.unit)) tl.weight.set(iv.unit, 1);
    }
    tl.tMax = resp.horizon;
    tl.changes = resp.intervals.length;
    return tl;
  }

  units(): number[] {
    return [...this.lanes.keys()].sort((a, b) => a - b);
  }

  /** Share of GPUs per role at every change time, from all lanes (a unit first seen late
   * still counts from t=0 in the role it left). Cached until the next change. */
  shares(): Shares {
    if (this.cached && this.cachedAt === this.changes) return this.cached;
    const times = [...new Set([...this.lanes.values()].flatMap((l) => l.map((s) => s.start)))].sort((a, b) => a - b);
    const out: Shares = { t: times, share: { rollout: [], train: [], switching: [], idle: [] } };
    const at = new Map<number, number>(); // lane cursor: index of the segment holding t
    for (const t of times) {
      const by: Record<Role, number> = { rollout: 0, train: 0, switching: 0, idle: 0 };
      let total = 0;
      for (const [unit, lane] of this.lanes) {
        let i = at.get(unit) ?? -1;
        while (i + 1 < lane.length && lane[i + 1].start <= t) i++;
        at.set(unit, i);
        if (i < 0) continue; // the unit's role is not known yet at t
        const w = this.weight.get(unit) ?? 1;
        by[lane[i].role] += w;
        total += w;
      }
      for (const role of ROLES) out.share[role].push(total ? by[role] / total : 0);
    }
    this.cached = out;
    this.cachedAt = this.changes;
    return out;
  }

  /** Seconds each role was held, summed over units, up to `now` (defaults to tMax). */
  totals(now = this.tMax): Record<Role, number> {
    const out: Record<Role, number> = { rollout: 0, train: 0, switching: 0, idle: 0 };
    for (const lane of this.lanes.values())
      for (const seg of lane) out[seg.role] += Math.max(0, (seg.end ?? now) - seg.start);
    return out;
  }
}

export const ROLE_COLORS: Record<Role, string> = {
  rollout: "#2f7ed8",
  train: "#e4572e",
  switching: "#f3a712",
  idle: "#c8ccd2",
};
