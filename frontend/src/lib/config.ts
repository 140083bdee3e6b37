// The launch form, generated from gyre_core's config schema ({"dotted.path": entry}):
// fields grouped by section, string input parsed to typed values, dotted <-> nested
// config, and the API's 400 errors mapped back onto fields.

import type { ConfigSchema, SchemaEntry } from "./types";

export type FormValues = Record<string, string>; // dotted path -> raw input text
export type FieldErrors = Record<string, string[]>;

export function groups(schema: ConfigSchema): [string, string[]][] {
  const out = new Map<string, string[]>();
  for (const path of Object.keys(schema)) {
    const section = path.includes(".") ? path.slice(0, path.indexOf(".")) : "run";
    out.set(section, [...(out.get(section) ?? []), path]);
  }
  return [...out.entries()];
}

export function defaults(schema: ConfigSchema): FormValues {
  const out: FormValues = {};
  for (const [path, e] of Object.entries(schema)) out[path] = show(e.default);
  return out;
}

function show(v: unknown): string {
  if (v === null || v === undefined) return "";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** Parse one field; returns [value] or an error message. */
export function parseField(entry: SchemaEntry, raw: string): { value?: unknown; error?: string } {
  const text = raw.trim();
  const type = entry.type;
  let value: unknown = raw;
  if (type === "int" || type === "float") {
    if (text === "") return { error: "required" };
    const n = Number(text);
    if (!Number.isFinite(n)) return { error: `not a number: ${JSON.stringify(raw)}` };
    if (type === "int" && !Number.isInteger(n)) return { error: "must be a whole number" };
    if (entry.min !== undefined && n < entry.min) return { error: `must be at least ${entry.min}` };
    if (entry.max !== undefined && n > entry.max) return { error: `must be at most ${entry.max}` };
    if (entry.above !== undefined && n <= entry.above) return { error: `must be more than ${entry.above}` };
    value = n;
  } else if (type === "bool") {
    if (!["true", "false"].includes(text)) return { error: "true or false" };
    value = text === "true";
  } else if (type.startsWith("list") || type.startsWith("dict") || type.startsWith("tuple")) {
    try {
      value = JSON.parse(text || "null");
    } catch {
      return { error: "not valid JSON" };
    }
  }
  if (entry.choices && !entry.choices.map(String).includes(String(value)))
    return { error: `one of ${entry.choices.join(", ")}` };
  return { value };
}

/** Validate the whole form; returns the nested config (every field) and the per-field
 * errors. */
export function buildConfig(schema: ConfigSchema, values: FormValues): { config: Record<string, unknown>; errors: FieldErrors } {
  const config: Record<string, unknown> = {};
  const errors: FieldErrors = {};
  for (const [path, entry] of Object.entries(schema)) {
    const raw = values[path] ?? show(entry.default);
    const { value, error } = parseField(entry, raw);
    if (error) errors[path] = [error];
    else setPath(config, path, value);
  }
  return { config, errors };
}

export function setPath(obj: Record<string, unknown>, path: string, value: unknown): void {
  const parts = path.split(".");
  let cur = obj;
  for (const p of parts.slice(0, -1)) {
    if (typeof cur[p] !== "object" || cur[p] === null) cur[p] = {};
    cur = cur[p] as Record<string, unknown>;
  }
  cur[parts[parts.length - 1]] = value;
}

/** A nested config -> dotted form values (for presets and forks). */
export function flattenConfig(config: Record<string, unknown>, prefix = ""): FormValues {
  const out: FormValues = {};
  for (const [k, v] of Object.entries(config)) {
    const path = prefix + k;
    if (v && typeof v === "object" && !Array.isArray(v)) Object.assign(out, flattenConfig(v as Record<string, unknown>, `${path}.`));
    else out[path] = show(v);
  }
  return out;
}

/** The 400 body of POST /api/runs/ -> errors by field path (`config.*` unwrapped). */
export function apiErrors(body: unknown): FieldErrors {
  const out: FieldErrors = {};
  if (!body || typeof body !== "object") return { _form: [String(body ?? "request failed")] };
  const add = (key: string, v: unknown): void => {
    const msgs = Array.isArray(v) ? v.map(String) : [typeof v === "string" ? v : JSON.stringify(v)];
    out[key] = [...(out[key] ?? []), ...msgs];
  };
  for (const [key, v] of Object.entries(body as Record<string, unknown>)) {
    if (key === "config" && v && typeof v === "object" && !Array.isArray(v)) {
      for (const [field, msgs] of Object.entries(v as Record<string, unknown>)) add(field, msgs);
    } else add(key === "detail" || key === "non_field_errors" ? "_form" : key, v);
  }
  return out;
}

/** GET /api/config/presets/: the configs of the repository's `configs/` by name. */
export interface PresetsResponse {
  default: Record<string, unknown>;
  presets: Record<string, Record<string, unknown>>;
}

/** The presets as form values by name (each a nested config flattened to dotted paths). */
export function presetValues(resp: PresetsResponse): Record<string, FormValues> {
  const out: Record<string, FormValues> = {};
  for (const [name, config] of Object.entries(resp.presets)) out[name] = flattenConfig(config ?? {});
  return out;
}
