// Shapes of the platform API (platform/gyre_web) as the dashboard reads them.

export type Role = "rollout" | "train" | "switching" | "idle";
export const ROLES: Role[] = ["rollout", "train", "switching", "idle"];

export interface RunEvent {
  seq: number;
  kind: string;
  t: number; // seconds on the run's clock (simulated time for a sim run)
  wall: string;
  data: Record<string, unknown>;
}

export interface Run {
  id: number;
  experiment: number;
  name: string;
  config?: Record<string, unknown>;
  policy: string;
  backend: string;
  seed: number;
  steps: number;
  status: string;
  step: number;
  error: string;
  parent: number | null;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  can_edit?: boolean; // the caller may cancel, pause, resume, fork (a writer in the team)
  source?: string; // "launched" by a worker, or "reported" from a terminal (gyre run --report-to)
}

export interface Experiment {
  id: number;
  team: number;
  name: string;
  description: string;
  tags: string[];
  visibility: string;
}

export interface Team {
  id: number;
  name: string;
  slug: string;
  role: string | null;
}

/** Team roles that may launch and control runs (platform teams.models.WRITE_ROLES). */
export const WRITE_ROLES = ["owner", "admin", "member"];

export interface Page<T> {
  next: string | null;
  previous: string | null;
  results: T[];
}

export interface MetricBucket {
  step: number;
  last_step: number;
  min: number;
  max: number;
  last: number;
}

export interface MetricSeries {
  run: number;
  name: string;
  points: MetricBucket[];
}

export interface MetricsResponse {
  bucket: number;
  series: MetricSeries[];
}

export interface TreeInfo {
  id: number;
  run: number;
  group_id: string;
  step: number; // the training step whose batch this part of the group was; 0: an upload
  rollouts: number;
  nodes: number;
  depth: number;
  tokens_unique: number;
  tokens_per_call: number;
  dedup_ratio: number;
  branch_counts: Record<string, number>;
}

export interface TreeNode {
  id: number;
  parent: number | null;
  kind: string;
  depth: number;
  path_key: string;
  token_start: number;
  token_end: number;
  trainable: number;
  preview: string;
  advantage: number | null;
  leaves: number;
  // generated tokens the step trained, where the run samples paths (train.max_paths);
  // null or absent: it trains every one
  taken?: number | null;
}

/** A node whose generated tokens its step left untrained (path sampling passed it by). */
export const untrained = (n: TreeNode): boolean => n.taken === 0 && n.trainable > 0;

export type SchemaEntry = {
  type: string;
  default: unknown;
  help: string;
  choices?: unknown[];
  min?: number;
  max?: number;
  /** exclusive lower bound */
  above?: number;
};
export type ConfigSchema = Record<string, SchemaEntry>;

export type LogLevel = "debug" | "info" | "warning" | "error";

export interface LogLine {
  seq: number;
  time: string;
  source: "runtime" | "worker";
  level: LogLevel;
  text: string;
}

export interface LogPage {
  run: number;
  last_seq: number; // the newest line stored, whatever the filter
  lines: LogLine[];
}
